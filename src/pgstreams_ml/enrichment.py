"""The enrichment store: user profiles and the ad catalogue in PostgreSQL, built from the updates topic.

A stream group (default ``ml-enrichment``) consumes ``user_profile`` and ``ad_catalogue`` events and, in the
same transaction as its checkpoint (exactly once), upserts the current row of each key (an older version
arriving late never overwrites a newer one) and appends the version to a history table. The scorer reads
current rows by key; the join pipeline reads the version valid at each impression's time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

import pgstreams
from pgstreams.models import Event

from . import _sql, events
from .config import Topology
from .domain import CATEGORIES, COUNTRIES

log = logging.getLogger(__name__)

_USER_COLS = ("user_id", "age", "country", "fav_category", "activity")
_AD_COLS = ("ad_id", "advertiser", "category", "price", "quality")


def _num(v: object, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def parse_update(value: object) -> tuple[str, dict[str, Any], datetime] | None:
    """Validate an update event's value: ``(type, fields, valid_from)``, or ``None`` if it is invalid
    (unknown type, missing or out-of-domain field, timestamp without a zone)."""
    if isinstance(value, (bytes, str)):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    ts = events.parse_ts(value.get("ts"))
    kind = value.get("type")
    if ts is None or kind not in events.UPDATE_TYPES:
        return None
    if kind == "user_profile":
        f = {c: value.get(c) for c in _USER_COLS}
        ok = (
            isinstance(f["user_id"], str)
            and isinstance(f["age"], int)
            and not isinstance(f["age"], bool)
            and 0 < f["age"] < 130
            and f["country"] in COUNTRIES
            and f["fav_category"] in CATEGORIES
            and _num(f["activity"], 0.0, 1.0)
        )
    else:
        f = {c: value.get(c) for c in _AD_COLS}
        ok = (
            isinstance(f["ad_id"], str)
            and isinstance(f["advertiser"], str)
            and f["category"] in CATEGORIES
            and _num(f["price"], 0.0, 1e9)
            and _num(f["quality"], 0.0, 1.0)
        )
    return (str(kind), f, ts) if ok else None


def apply_updates(
    conn: psycopg.Connection, schema: str, batch: Iterable[Event | Mapping[str, Any]]
) -> Counter[str]:
    """Fold update events (or their values) into the store on ``conn`` (in the caller's transaction).

    Returns counts: ``users``, ``ads`` (versions received), ``invalid`` (skipped). Idempotent: applying the
    same events again changes nothing.
    """
    counts: Counter[str] = Counter()
    users: dict[tuple[str, datetime], dict[str, Any]] = {}
    ads: dict[tuple[str, datetime], dict[str, Any]] = {}
    for item in batch:
        value = item.value if isinstance(item, Event) else item
        parsed = parse_update(value)
        if parsed is None:
            counts["invalid"] += 1
            log.warning("skipping invalid update event %r", getattr(item, "event_id", None))
            continue
        kind, f, ts = parsed
        if kind == "user_profile":
            users[(f["user_id"], ts)] = f
            counts["users"] += 1
        else:
            ads[(f["ad_id"], ts)] = f
            counts["ads"] += 1
    cur = conn.cursor()
    for rows, cols, hist_q, cur_q in (
        (users, _USER_COLS, "insert_user_history", "upsert_users"),
        (ads, _AD_COLS, "insert_ad_history", "upsert_ads"),
    ):
        if not rows:
            continue
        keys = sorted(rows)
        arrays = [[rows[k][c] for k in keys] for c in cols] + [[k[1] for k in keys]]
        cur.execute(_sql.q(hist_q, schema), arrays)
        latest: dict[str, tuple[str, datetime]] = {}
        for k in keys:  # sorted by (id, valid_from): the last one per id is the newest
            latest[k[0]] = k
        newest = [latest[i] for i in sorted(latest)]
        arrays = [[rows[k][c] for k in newest] for c in cols] + [[k[1] for k in newest]]
        cur.execute(_sql.q(cur_q, schema), arrays)
    return counts


class EnrichmentStore:
    """Reads the store by key. ``schema`` defaults to ``ml``."""

    def __init__(self, client: pgstreams.Client, schema: str = "ml") -> None:
        self.client = client
        self.schema = schema

    def _get(
        self, name: str, ids: Sequence[str], conn: psycopg.Connection | None
    ) -> dict[str, dict[str, Any]]:
        ids = sorted(set(ids))
        if not ids:
            return {}
        if conn is None:
            with self.client.connection() as c:
                cur = c.execute(_sql.q(name, self.schema), (ids,))
                rows, desc = cur.fetchall(), cur.description
        else:
            cur = conn.execute(_sql.q(name, self.schema), (ids,))
            rows, desc = cur.fetchall(), cur.description
        cols = [d.name for d in desc or ()]
        return {r[0]: dict(zip(cols, r, strict=True)) for r in rows}

    def users(self, ids: Sequence[str], conn: psycopg.Connection | None = None) -> dict[str, dict[str, Any]]:
        """Current profiles of ``ids`` (missing ids are absent from the result)."""
        return self._get("get_users", ids, conn)

    def ads(self, ids: Sequence[str], conn: psycopg.Connection | None = None) -> dict[str, dict[str, Any]]:
        """Current catalogue entries of ``ids`` (missing ids are absent from the result)."""
        return self._get("get_ads", ids, conn)


def enrichment_worker(
    client: pgstreams.Client,
    topo: Topology,
    *,
    max_events: int = 1000,
    max_wait: float = 0.2,
    heartbeat_interval: float = 1.0,
    session_timeout: float = 10.0,
) -> tuple[pgstreams.Worker, Counter[str]]:
    """A :class:`pgstreams.Worker` (not started) that folds the updates topic into the store as a member
    of group ``topo.enrichment_group``, each batch in the checkpoint's transaction (exactly once), and the
    counter it updates (``users``, ``ads``, ``invalid``)."""
    total: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(batch: list[Event], conn: psycopg.Connection) -> None:
        counts = apply_updates(conn, topo.schema, batch)
        with lock:
            total.update(counts)

    worker = pgstreams.Worker(client, install_signal_handlers=False)
    worker.subscribe(
        topo.updates_topic,
        topo.enrichment_group,
        handle,
        batch=True,
        mode="transactional",
        max_events=max_events,
        max_wait=max_wait,
        heartbeat_interval=heartbeat_interval,
        session_timeout=session_timeout,
    )
    return worker, total


def run_enrichment(client: pgstreams.Client, topo: Topology, stop: threading.Event) -> Counter[str]:
    """Run the enrichment worker until ``stop`` is set; return its counts."""
    worker, total = enrichment_worker(client, topo)
    worker.run(until=stop)
    return total
