"""The collectors: database-wide status metrics, a worker's own metrics and a Kafka gateway's (Prometheus
naming: the ``pgstreams_`` prefix, base units, ``_total`` for counters)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

try:
    from prometheus_client import Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('pgstreams.metrics needs prometheus_client: pip install "pgstreams[metrics]"') from exc

from ..models import GROUP_STATES, PARTITION_STATES, GroupLag, StatusSnapshot, group_state
from .defaults import DEFAULT_DURATION_BUCKETS, DEFAULT_MIN_INTERVAL
from .exposition import FastFamily, label_text

if TYPE_CHECKING:
    from ..client import Client
    from ..worker import Worker

log = logging.getLogger("pgstreams.metrics")


class GatewayLike(Protocol):
    """What :class:`GatewayCollector` reads of a :class:`pgstreams.kafka.Gateway` (the ``kafka`` extra is
    not imported here): its counters and its advertised address."""

    @property
    def stats(self) -> Any: ...

    @property
    def advertised(self) -> tuple[str, int]: ...

_TOPIC = ("topic",)
_PARTITION = ("topic", "partition")
_GROUP = ("group", "topic", "partition")
_MEMBER = ("group", "topic", "member")


class StatusCollector(Collector):
    """Database-wide metrics of one schema, read through ``client.status()`` (or ``status``, any callable
    returning a :class:`pgstreams.StatusSnapshot`), in O(topics + partitions + groups + members) work
    per read, never O(events). A read is reused for ``min_interval`` seconds (default
    :data:`DEFAULT_MIN_INTERVAL`): however many scrapers ask, the database is read at most once per
    interval. A failed read is logged and exported as ``pgstreams_up 0`` (the endpoint stays up).
    ``clock`` (default ``time.monotonic``) times the reuse.

    ``read_now`` (default true): read the status once when created, so that no scrape pays for a client's
    first read (it reads every topic; later reads only the topics that changed since, see
    ``docs/metrics.md``). That read serves the scrapes of the next ``min_interval`` like any other; when
    it fails, the failure is logged and the first scrape reads again. False: the first scrape reads."""

    def __init__(self, client: Client | None = None, *, status: Callable[[], StatusSnapshot] | None = None,
                 min_interval: float = DEFAULT_MIN_INTERVAL, clock: Callable[[], float] = time.monotonic,
                 read_now: bool = True) -> None:
        if (client is None) == (status is None):
            raise ValueError("pass either a client or a status callable")
        if isinstance(min_interval, bool) or not isinstance(min_interval, int | float) or min_interval < 0:
            raise ValueError(f"min_interval must be a number of seconds >= 0, not {min_interval!r}")
        if not isinstance(read_now, bool):
            raise ValueError(f"read_now must be True or False, not {read_now!r}")
        self._status: Callable[[], StatusSnapshot] = status if status is not None else client.status  # type: ignore[union-attr]
        self.min_interval = float(min_interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: StatusSnapshot | None = None
        self._read_at: float | None = None
        self._ok = False
        self.reads = 0
        self.failures = 0
        if read_now and self.snapshot() is None:
            self._read_at = None  # logged; the first scrape reads again (and reports it if it fails too)

    def snapshot(self) -> StatusSnapshot | None:
        """The current status: the last read if younger than ``min_interval``, else a new one (``None``
        when reading failed). Concurrent callers wait for one read."""
        with self._lock:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < self.min_interval:
                return self._snapshot if self._ok else None
            self._read_at = now
            self.reads += 1
            try:
                self._snapshot = self._status()
                self._ok = True
            except Exception as exc:  # noqa: BLE001 - the exporter reports it and keeps serving
                self.failures += 1
                self._ok = False
                log.warning("reading the pgstreams status failed: %s", str(exc).strip())
            return self._snapshot if self._ok else None

    def describe(self) -> list[Metric]:
        """Nothing up front: a registry must not read the database when the collector is registered."""
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        up = GaugeMetricFamily("pgstreams_up", "1 if the last status read succeeded, else 0")
        up.add_metric([], 1.0 if snap is not None else 0.0)
        yield up
        reads = CounterMetricFamily("pgstreams_status_reads", "Status reads from the database (each serves "
                                    "every scrape within the minimum interval)")
        reads.add_metric([], float(self.reads))
        yield reads
        if snap is None:
            return
        dur = GaugeMetricFamily("pgstreams_status_read_duration_seconds",
                                "How long the last status read took")
        dur.add_metric([], snap.duration)
        yield dur
        yield from _status_metrics(snap)


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> FastFamily:
    return FastFamily(name, doc, "gauge", labels)


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> FastFamily:
    return FastFamily(name, doc, "counter", labels)


def _partition_sizes(snap: StatusSnapshot) -> dict[tuple[str, int], float]:
    """Each partition's share of its topic's size, in proportion to the events it stores (evenly while
    the topic stores none): a topic's segments hold every partition's events, so the catalog knows sizes
    per topic only, and counting each partition's bytes would read every event. The shares of a topic
    add up to its size."""
    stored: dict[str, int] = {}
    for p in snap.partitions:
        stored[p.topic] = stored.get(p.topic, 0) + p.events
    sizes = {t.topic: (t.bytes, t.partitions) for t in snap.topics}
    out: dict[tuple[str, int], float] = {}
    for p in snap.partitions:
        if p.topic not in sizes:
            continue
        total, count = sizes[p.topic]
        events = stored[p.topic]
        out[(p.topic, p.partition)] = total * p.events / events if events else total / max(1, count)
    return out


def _status_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    parts = _gauge("pgstreams_topic_partitions", "Partitions of a topic", _TOPIC)
    size = _gauge("pgstreams_topic_size_bytes", "Size of a topic on disk (segments, indexes, TOAST)", _TOPIC)
    segments = _gauge("pgstreams_topic_segments", "Storage segments of a topic", _TOPIC)
    retention = _gauge("pgstreams_topic_retention_seconds", "Retention by age of a topic (topics with one)",
                       _TOPIC)
    dead = _gauge("pgstreams_dead_letters", "Dead letters stored in a dead-letter topic", _TOPIC)
    dirty = _gauge("pgstreams_topic_dirty_ratio", "Share of a compacted topic's mapped events that a newer "
                   "event of their key superseded", _TOPIC)
    compacted = _counter("pgstreams_topic_compacted_events", "Events compaction removed from a topic", _TOPIC)
    compacted_bytes = _counter("pgstreams_topic_compacted_bytes", "Bytes compaction freed in a topic", _TOPIC)
    compacted_at = _gauge("pgstreams_topic_last_compaction_timestamp_seconds",
                          "Unix time of a topic's last segment rewrite by compaction", _TOPIC)
    dlt_topics = set()
    for t in snap.topics:
        labels: tuple[str, ...] = (t.topic,)
        text = label_text(_TOPIC, labels)
        parts.add(labels, t.partitions, text)
        size.add(labels, t.bytes, text)
        segments.add(labels, t.segments, text)
        if t.retention_ms is not None:
            retention.add(labels, t.retention_ms / 1000, text)
        if t.dirty_ratio is not None:
            dirty.add(labels, t.dirty_ratio, text)
        if t.events_compacted:
            compacted.add(labels, t.events_compacted, text)
            compacted_bytes.add(labels, t.bytes_compacted, text)
        if t.compacted_at is not None:
            compacted_at.add(labels, t.compacted_at.timestamp(), text)
        if t.dead_letter:
            dlt_topics.add(t.topic)
    head = _gauge("pgstreams_partition_head_position", "Position of a partition's newest event", _PARTITION)
    events = _gauge("pgstreams_partition_events", "Events stored in a partition", _PARTITION)
    published = _counter("pgstreams_partition_events_published", "Events published to a partition "
                         "(stored plus removed by retention; its rate is the publish rate)", _PARTITION)
    part_size = _gauge("pgstreams_partition_estimated_size_bytes", "A topic's size shared among its "
                       "partitions by their stored events (an estimate: segments hold every partition)",
                       _PARTITION)
    estimates = _partition_sizes(snap)
    dead_counts: dict[str, int] = {}
    for p in snap.partitions:
        labels = (p.topic, str(p.partition))
        text = label_text(_PARTITION, labels)
        if p.head is not None:
            head.add(labels, p.head, text)
        events.add(labels, p.events, text)
        published.add(labels, p.published, text)
        if (p.topic, p.partition) in estimates:
            part_size.add(labels, estimates[(p.topic, p.partition)], text)
        if p.topic in dlt_topics:
            dead_counts[p.topic] = dead_counts.get(p.topic, 0) + p.events
    for topic, n in sorted(dead_counts.items()):
        dead.add((topic,), n)
    yield from (parts, size, segments, retention, head, events, published, part_size, dead, dirty, compacted,
                compacted_bytes, compacted_at)
    lag = _gauge("pgstreams_group_lag_events", "Events after a group's checkpoint", _GROUP)
    lag_s = _gauge("pgstreams_group_lag_seconds", "Age of a group's first unread event (0: caught up)",
                   _GROUP)
    cp = _gauge("pgstreams_group_checkpoint_position", "A group's committed position", _GROUP)
    cp_age = _gauge("pgstreams_group_checkpoint_age_seconds", "Seconds since a group's checkpoint moved",
                    _GROUP)
    owned = _gauge("pgstreams_group_partition_owned", "1 if a live member holds the partition's lease",
                   _GROUP)
    stale = _gauge("pgstreams_group_partition_stale", "1 if the partition's owner missed its session timeout",
                   _GROUP)
    retrying = _gauge("pgstreams_group_partition_retrying", "1 if the group is retrying (or blocked on) an "
                      "event of the partition", _GROUP)
    for g in snap.groups:
        labels = (g.group, g.topic, str(g.partition))
        text = label_text(_GROUP, labels)
        lag.add(labels, g.lag, text)
        lag_s.add(labels, g.lag_seconds, text)
        cp.add(labels, g.checkpoint or 0, text)
        cp_age.add(labels, g.checkpoint_age, text)
        owned.add(labels, 1.0 if g.owner is not None and not g.stale else 0.0, text)
        stale.add(labels, 1.0 if g.stale else 0.0, text)
        retrying.add(labels, 1.0 if g.retry_state is not None else 0.0, text)
    # the states in the words of describe_group, the CLI and the console: 1 for the current one
    part_state = _gauge("pgstreams_group_partition_state", "1 for the group's state on the partition "
                        "(pgstreams.PARTITION_STATES)", (*_GROUP, "state"))
    group_st = _gauge("pgstreams_group_state", "1 for the group's state on the topic "
                      "(pgstreams.GROUP_STATES)", ("group", "topic", "state"))
    by_topic: dict[tuple[str, str], list[GroupLag]] = {}
    for g in snap.groups:
        by_topic.setdefault((g.group, g.topic), []).append(g)
        now = g.state
        for st in PARTITION_STATES:
            if st != "handing over":  # not part of the database-wide status
                labels = (g.group, g.topic, str(g.partition), st)
                part_state.add(labels, 1.0 if st == now else 0.0, label_text((*_GROUP, "state"), labels))
    for (group, topic), statuses in sorted(by_topic.items()):
        now = group_state(statuses)
        for st in GROUP_STATES:
            labels = (group, topic, st)
            group_st.add(labels, 1.0 if st == now else 0.0, label_text(("group", "topic", "state"), labels))
    yield from (lag, lag_s, cp, cp_age, owned, stale, retrying, part_state, group_st)
    hb = _gauge("pgstreams_member_heartbeat_age_seconds", "Seconds since a member's last heartbeat", _MEMBER)
    mparts = _gauge("pgstreams_member_partitions", "Partitions a member owns", _MEMBER)
    mstale = _gauge("pgstreams_member_stale", "1 if a member missed its session timeout", _MEMBER)
    for m in snap.members:
        labels = (m.group, m.topic, m.member_id)
        text = label_text(_MEMBER, labels)
        hb.add(labels, m.heartbeat_age, text)
        mparts.add(labels, m.partitions, text)
        mstale.add(labels, 1.0 if m.stale else 0.0, text)
    yield from (hb, mparts, mstale)
    if snap.shares:
        yield from _share_metrics(snap)


#: Share-group gauges: (ShareGroupStatus field, metric name, help)
_SHARE_GAUGES = (
    ("acquired", "pgstreams_share_group_in_flight_events",
     "Events of a share group locked by a consumer now"),
    ("available", "pgstreams_share_group_available_events",
     "Events a share group's consumers can acquire now (due again, or after its frontier)"),
    ("waiting", "pgstreams_share_group_waiting_events",
     "Events released or published with a delay, or waiting behind an earlier event of their key"),
    ("delivered_too_often", "pgstreams_share_group_delivered_too_often_events",
     "Events delivered max_deliveries times and not locked: about to be dead-lettered"),
    ("frontier", "pgstreams_share_group_frontier_position",
     "The last position a share group took into its state"),
)
#: Share-group counters (since the group was created): (field, metric name without _total, help)
_SHARE_COUNTERS = (
    ("removed_too_often", "pgstreams_share_group_deliveries_exhausted_events",
     "Events a share group removed after max_deliveries deliveries"),
    ("rejected", "pgstreams_share_group_rejected_events", "Events a share group's consumers rejected"),
    ("dead_lettered", "pgstreams_share_group_dead_lettered_events",
     "Copies a share group published to its dead-letter topic"),
    ("lost_events", "pgstreams_share_group_lost_events",
     "Events retention removed before a share group settled them"),
)


def _share_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    gauges = [(field, _gauge(name, doc, _GROUP)) for field, name, doc in _SHARE_GAUGES]
    counters = [(field, _counter(name, doc, _GROUP)) for field, name, doc in _SHARE_COUNTERS]
    lock_age = _gauge("pgstreams_share_group_oldest_lock_age_seconds",
                      "Age of the oldest lock a share group's consumers hold (0: none)", _GROUP)
    for s in snap.shares:
        labels = (s.group, s.topic, str(s.partition))
        text = label_text(_GROUP, labels)
        for field, gauge in gauges:
            gauge.add(labels, getattr(s, field), text)
        for field, counter in counters:
            counter.add(labels, getattr(s, field), text)
        age = 0.0 if s.oldest_lock is None else (snap.taken_at - s.oldest_lock).total_seconds()
        lock_age.add(labels, max(0.0, age), text)
    yield from (metric for _, metric in gauges)
    yield from (metric for _, metric in counters)
    yield lock_age


_WORKER_COUNTERS = (
    ("events", "pgstreams_worker_events_handled", "Events the worker's handlers handled"),
    ("failures", "pgstreams_worker_events_failed", "Handler calls that raised"),
    ("retries", "pgstreams_worker_events_retried", "Failed events or batches scheduled again"),
    ("dead_lettered", "pgstreams_worker_events_dead_lettered", "Events sent to a dead-letter topic"),
    ("batches", "pgstreams_worker_batches", "Batches delivered"),
    ("commits", "pgstreams_worker_commits", "Checkpoint commits"),
    ("fenced", "pgstreams_worker_commits_fenced", "Commits refused because the lease moved"),
    ("rebalances", "pgstreams_worker_rebalances", "Changes of the worker's partitions"),
    ("polls", "pgstreams_worker_polls", "Fetches from the database"),
)


class WorkerCollector(Collector):
    """A :class:`pgstreams.Worker`'s own metrics (label ``member``): counters of events handled, failed,
    retried and dead-lettered (and batches, commits, fenced commits, rebalances, polls), and histograms
    of handler and batch durations per topic and group (``buckets``: default
    :data:`DEFAULT_DURATION_BUCKETS`). Create it before the worker runs: durations are recorded from then
    on."""

    def __init__(self, worker: Worker, *, buckets: tuple[float, ...] = DEFAULT_DURATION_BUCKETS) -> None:
        self.worker = worker
        labels = ("member", "topic", "group")
        self._handler = Histogram("pgstreams_worker_handler_duration_seconds", "Duration of handler calls",
                                  labels, registry=None, buckets=buckets)
        self._batch = Histogram("pgstreams_worker_batch_duration_seconds", "Duration of a batch through its "
                                "retries and commits", labels, registry=None, buckets=buckets)
        worker.stats.watch(self._observe)

    def _observe(self, kind: str, seconds: float, topic: str, group: str) -> None:
        hist = self._handler if kind == "handler" else self._batch
        hist.labels(self.worker.member_id, topic, group).observe(max(0.0, seconds))

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counts: dict[str, Any] = self.worker.stats.snapshot()
        for key, name, doc in _WORKER_COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=["member"])
            fam.add_metric([self.worker.member_id], float(counts.get(key, 0)))
            yield fam
        yield from self._handler.collect()
        yield from self._batch.collect()


class GatewayCollector(Collector):
    """A Kafka gateway's own metrics (label ``gateway``: its advertised address): open connections, the
    connections accepted, requests and requests answered with an error per API (``api``: the name in
    Kafka's schemas, e.g. ``produce``), and a histogram of request durations per API (``buckets``:
    default :data:`DEFAULT_DURATION_BUCKETS`). Create it before clients connect: durations are recorded
    from then on."""

    def __init__(self, gateway: GatewayLike, *, buckets: tuple[float, ...] = DEFAULT_DURATION_BUCKETS
                 ) -> None:
        self.gateway = gateway
        self._durations = Histogram("pgstreams_kafka_request_duration_seconds",
                                    "Duration of Kafka requests, from read to answer", ("gateway", "api"),
                                    registry=None, buckets=buckets)
        gateway.stats.watch(self._observe)

    def _label(self) -> str:
        host, port = self.gateway.advertised
        return f"{host}:{port}"

    def _observe(self, api: str, seconds: float) -> None:
        self._durations.labels(self._label(), api).observe(max(0.0, seconds))

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.gateway.stats.snapshot()
        label = self._label()
        fam = GaugeMetricFamily("pgstreams_kafka_connections_open", "Open client connections",
                                labels=["gateway"])
        fam.add_metric([label], float(snap["open_connections"]))
        yield fam
        total = CounterMetricFamily("pgstreams_kafka_connections", "Client connections accepted",
                                    labels=["gateway"])
        total.add_metric([label], float(snap["connections"]))
        yield total
        for key, name, doc in (("requests", "pgstreams_kafka_requests", "Kafka requests answered"),
                               ("errors", "pgstreams_kafka_request_errors",
                                "Kafka requests answered with an error code, or refused")):
            fam_api = CounterMetricFamily(name, doc, labels=["gateway", "api"])
            for api, n in sorted(snap[key].items()):
                fam_api.add_metric([label, api], float(n))
            yield fam_api
        yield from self._durations.collect()
