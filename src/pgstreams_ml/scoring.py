"""Online scoring: a worker group that scores impressions from the clean topic with the deployed model.

Each batch: keep the impressions, read the users' profiles and the ads' catalogue entries by key from the
enrichment store, score with the deployed model (reloaded as soon as another one is deployed: the deployed
id is checked once per batch, a cheap indexed query), and publish one prediction per impression to the
predictions topic with event id ``pred:<impression_id>``. Publishing before committing the checkpoint makes
delivery at-least-once and the idempotent event id makes the effect exactly once: a batch handled again
after a crash publishes nothing twice. Impressions that arrive while no model is deployed, or whose user or
ad is not in the store yet, are counted and skipped.

Predictions carry the model id, the probability and the inputs monitored for drift.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pgstreams
from pgstreams.models import Event

from . import registry
from .config import Topology
from .enrichment import EnrichmentStore

log = logging.getLogger(__name__)


class Scorer:
    """Turns batches of clean events into prediction messages with the deployed model of ``topo``."""

    def __init__(self, client: pgstreams.Client, topo: Topology) -> None:
        self.client = client
        self.topo = topo
        self.store = EnrichmentStore(client, topo.schema)
        self.model: registry.ScoringModel | None = None
        self.counts: Counter[str] = Counter()
        self.reloads = 0

    def refresh_model(self) -> registry.ScoringModel | None:
        """Load the deployed model if it changed; return the model in use (``None``: none deployed)."""
        with self.client.connection() as conn:
            mid = registry.deployed_id(conn, self.topo.schema, self.topo.model_name)
            if mid is None:
                self.model = None
            elif self.model is None or self.model.model_id != mid:
                self.model = registry.scoring_model(mid, registry.artefact(conn, self.topo.schema, mid))
                self.reloads += 1
                log.info("scorer loaded model %s", mid)
        return self.model

    def score(self, batch: Sequence[Event]) -> list[pgstreams.Message]:
        """Prediction messages for the impressions in ``batch``."""
        imps = []
        for e in batch:
            if e.event_type != "impression":
                continue
            try:
                imps.append(json.loads(e.value) if isinstance(e.value, (str, bytes)) else dict(e.value))
            except (ValueError, TypeError):
                self.counts["unreadable"] += 1
        if not imps:
            return []
        model = self.refresh_model()
        if model is None:
            self.counts["no_model"] += len(imps)
            return []
        users = self.store.users([i["user_id"] for i in imps])
        ads = self.store.ads([i["ad_id"] for i in imps])
        out = []
        for imp in imps:
            u, a = users.get(imp["user_id"]), ads.get(imp["ad_id"])
            if u is None or a is None:
                self.counts["unenriched"] += 1
                continue
            row: dict[str, Any] = {**u, **a, "slot": imp["slot"], "device": imp["device"]}
            p = model.predict(row)
            value = {
                "impression_id": imp["event_id"],
                "ts": imp["ts"],
                "user_id": imp["user_id"],
                "ad_id": imp["ad_id"],
                "p": p,
                "model_id": model.model_id,
                "slot": imp["slot"],
                "device": imp["device"],
                "country": u["country"],
                "category": a["category"],
                "activity": u["activity"],
                "quality": a["quality"],
                "price": a["price"],
            }
            out.append(
                pgstreams.Message(
                    value=value,
                    key=imp["user_id"],
                    event_type="prediction",
                    event_id=f"pred:{imp['event_id']}",
                )
            )
        self.counts["scored"] += len(out)
        return out

    def handle(self, batch: Sequence[Event]) -> int:
        """Score ``batch`` and publish the predictions; return how many were published (new)."""
        msgs = self.score(batch)
        return self.client.publish_many(self.topo.predictions_topic, msgs) if msgs else 0


def scorer_worker(
    client: pgstreams.Client,
    topo: Topology,
    *,
    max_events: int = 5000,
    max_wait: float = 0.2,
    heartbeat_interval: float = 1.0,
    session_timeout: float = 10.0,
) -> tuple[pgstreams.Worker, Scorer]:
    """A :class:`pgstreams.Worker` (not started) running a :class:`Scorer` as a member of group
    ``topo.scorer_group`` on the clean topic (at-least-once delivery, idempotent publishing), and the
    scorer (for its counters). Start several, in threads or processes, to share the partitions.
    ``max_events`` (5000) is above what a clean micro-batch holds per partition, so the impressions a
    micro-batch publishes are scored in one handler call per partition (one lookup, one publish, one
    checkpoint) rather than in several."""
    scorer = Scorer(client, topo)
    lock = threading.Lock()

    def handle(batch: list[Event]) -> None:
        with lock:
            scorer.handle(batch)

    worker = pgstreams.Worker(client, install_signal_handlers=False)
    worker.subscribe(
        topo.clean_topic,
        topo.scorer_group,
        handle,
        batch=True,
        max_events=max_events,
        max_wait=max_wait,
        heartbeat_interval=heartbeat_interval,
        session_timeout=session_timeout,
    )
    return worker, scorer


def run_scorer(client: pgstreams.Client, topo: Topology, stop: threading.Event) -> Scorer:
    """Run one scorer worker until ``stop`` is set; return its scorer."""
    worker, scorer = scorer_worker(client, topo)
    worker.run(until=stop)
    return scorer
