"""pgstreams.metrics.render: the same text as prometheus_client.generate_latest, for every kind of family
pgstreams exports and for the families it leaves to generate_latest."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pgstreams.metrics import render
from pgstreams.metrics.exposition import FastFamily, label_text


class _Families:
    def collect(self) -> Iterator[Metric]:
        fast = FastFamily("pgstreams_x", "Help with a \\ backslash\nand a newline", "gauge",
                          ("topic", "partition"))
        fast.add(("or\"ders\\n", "0"), 1.5)
        fast.add(("new\nline", "1"), 1e21, label_text(("topic", "partition"), ("new\nline", "1")))
        yield fast
        counter = FastFamily("pgstreams_y", "A counter", "counter", ("group",))
        counter.add(("g",), 3)
        yield counter
        plain = GaugeMetricFamily("pgstreams_z", "A plain gauge", labels=["b", "a"])
        plain.add_metric(["2", "1"], float("nan"))
        plain.add_metric(["4", "3"], float("inf"), timestamp=12.5)
        yield plain
        created = CounterMetricFamily("pgstreams_c", "With created", labels=["k"], created=1700000000.0)
        created.add_metric(["v"], 7, created=1700000001.0)
        yield created
        yield GaugeMetricFamily("pgstreams_empty", "No samples")
        odd = GaugeMetricFamily("odd.name", "Outside the classic character set")
        odd.add_metric([], 1)
        yield odd


def test_render_gives_the_bytes_generate_latest_gives() -> None:
    registry = CollectorRegistry()
    registry.register(_Families())  # type: ignore[arg-type]
    Counter("pgstreams_requests", "Requests", ["path"], registry=registry).labels("/a").inc()
    Gauge("pgstreams_temp", "Temperature", registry=registry).set(-2.25)
    Histogram("pgstreams_seconds", "Durations", ["kind"], registry=registry).labels("x").observe(0.3)
    Info("pgstreams_build", "Build", registry=registry).info({"version": "1"})
    expected = generate_latest(registry)
    assert b"odd" in expected and b"pgstreams_seconds_bucket" in expected
    assert render(registry) == expected


def test_a_fast_family_reads_as_an_ordinary_one() -> None:
    fast = FastFamily("pgstreams_x", "Help", "counter", ("topic",))
    fast.add(("t",), 2)
    [sample] = fast.samples
    assert (sample.name, sample.labels, sample.value) == ("pgstreams_x_total", {"topic": "t"}, 2)
