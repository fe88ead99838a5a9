"""Results of ``bench.peers``: samples per system and round, and their tables (rich and Markdown).

Every workload is a table with one row per system: the median and the best of the rounds, the median as
a multiple of raw PostgreSQL's and of PgQ's, and the CPU spent per event. Ratios read as speed-ups: above
1 is better than the reference, for latencies too (the reference's latency divided by this one).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich.console import Console
from rich.table import Table

RAW = "raw PostgreSQL"
PGQ = "PgQ"


@dataclass
class Sample:
    """What one round of one system measured."""

    rate: float  # events/s: throughput, or the producer's achieved rate for latency
    events: int = 0
    seconds: float = 0.0
    client_cpu: float | None = None  # CPU seconds of the benchmark's own processes
    machine_cpu: float | None = None  # busy CPU seconds of the whole machine
    p50: float | None = None  # ms
    p99: float | None = None  # ms
    wanted: int = 0  # events the measurement was to handle (0: as many as its duration allows)

    @property
    def complete(self) -> bool:
        """False when the measurement stopped at its time limit before its ``wanted`` events."""
        return not self.wanted or self.events >= self.wanted

    def per_event(self, cpu: float | None) -> float | None:
        return None if cpu is None or not self.events else cpu * 1e6 / self.events


@dataclass
class Entry:
    """One system in one workload: how it is measured and what its rounds gave."""

    system: str
    how: str
    measure: Callable[[int], Sample] | None  # round index -> sample; None when the system is skipped
    samples: list[Sample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: bool = False

    def median(self, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.samples if getattr(s, attr) is not None]
        return statistics.median(values) if values else None

    def best(self, attr: str, higher_is_better: bool) -> float | None:
        values = [getattr(s, attr) for s in self.samples if getattr(s, attr) is not None]
        if not values:
            return None
        return max(values) if higher_is_better else min(values)

    def cpu_per_event(self, which: Literal["client_cpu", "machine_cpu"]) -> float | None:
        values = [v for s in self.samples if (v := s.per_event(getattr(s, which))) is not None]
        return statistics.median(values) if values else None


@dataclass
class Workload:
    """A workload run for every system, ``rounds`` times, alternating the systems."""

    name: str
    title: str
    kind: Literal["throughput", "latency"]
    entries: list[Entry]
    notes: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # the load average at the start of each measurement

    def reference(self, system: str, attr: str) -> float | None:
        """The median figure ``attr`` of ``system`` (of its best variant when it has several)."""
        values = [m for e in self.entries if e.system == system and (m := e.median(attr)) is not None]
        if not values:
            return None
        return max(values) if self.kind == "throughput" else min(values)


def _num(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _ratio(v: float | None, ref: float | None, higher_is_better: bool) -> str:
    if v is None or ref is None or not v or not ref:
        return "-"
    return f"{v / ref if higher_is_better else ref / v:.2f}"


def _rows(w: Workload) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, rows and footnotes of a workload's table."""
    notes = list(w.notes)
    rows = []
    if w.kind == "throughput":
        header = ["system", "how", "median events/s", "best events/s", "x raw", "x PgQ",
                  "client CPU µs/event", "machine CPU µs/event"]
        raw, pgq = w.reference(RAW, "rate"), w.reference(PGQ, "rate")
        for e in w.entries:
            med = e.median("rate")
            mark = ""
            if any(not s.complete for s in e.samples):
                mark = " *"
            rows.append([e.system, e.how, ("skipped" if e.measure is None else _num(med)) + mark,
                         _num(e.best("rate", True)),
                         _ratio(med, raw, True), _ratio(med, pgq, True),
                         _num(e.cpu_per_event("client_cpu"), 1), _num(e.cpu_per_event("machine_cpu"), 1)])
    else:
        header = ["system", "how", "p50 ms (median)", "p50 best", "p99 ms (median)", "p99 best",
                  "x raw p50 / p99", "x PgQ p50 / p99", "events/s"]
        raw50, raw99 = w.reference(RAW, "p50"), w.reference(RAW, "p99")
        pgq50, pgq99 = w.reference(PGQ, "p50"), w.reference(PGQ, "p99")
        for e in w.entries:
            p50, p99 = e.median("p50"), e.median("p99")
            rows.append([e.system, e.how, "skipped" if e.measure is None else _num(p50, 1),
                         _num(e.best("p50", False), 1), _num(p99, 1),
                         _num(e.best("p99", False), 1),
                         f"{_ratio(p50, raw50, False)} / {_ratio(p99, raw99, False)}",
                         f"{_ratio(p50, pgq50, False)} / {_ratio(p99, pgq99, False)}",
                         _num(e.median("rate"))])
    for e in w.entries:
        notes.extend(n for n in (f"{e.system}: {n}" for n in e.notes) if n not in notes)
    return header, rows, notes


def print_workload(w: Workload, console: Console) -> None:
    """Print a workload's table with rich, its footnotes below."""
    header, rows, notes = _rows(w)
    table = Table(title=w.title, title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i < 2 else "right", overflow="fold")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    for n in notes:
        console.print(f"  {n}", markup=False, highlight=False)


def markdown_workload(w: Workload) -> str:
    """A workload's table in Markdown, its footnotes as a list below."""
    header, rows, notes = _rows(w)
    out = [f"**{w.title}**", "", "| " + " | ".join(header) + " |",
           "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    if notes:
        out.append("")
        out += [f"* {n}" for n in notes]
    return "\n".join(out)


def durability_rows(settings: Sequence[tuple[str, str, str]]) -> tuple[list[str], list[list[str]]]:
    return ["system", "server", "durability"], [list(s) for s in settings]


def print_durability(settings: Sequence[tuple[str, str, str]], console: Console) -> None:
    header, rows = durability_rows(settings)
    table = Table(title="Durability of each system in this run", title_justify="left")
    for h in header:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console.print(table)


def markdown_durability(settings: Sequence[tuple[str, str, str]]) -> str:
    header, rows = durability_rows(settings)
    out = ["| " + " | ".join(header) + " |", "|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
