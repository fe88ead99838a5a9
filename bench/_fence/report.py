"""Figures and tables of the read-fence benchmark: latency per reader and phase, the verdict per reader,
and poll throughput; printed with rich and as Markdown."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from .._common import percentile
from .processes import Record

NONE, SAME, OTHER = "none", "same", "other"  # phase kinds: no other transaction; one open here; elsewhere
BAR_MS = 50.0  #: p99 with the transaction open may exceed p99 without it by at most this
THROUGHPUT_FLOOR = 0.9  #: poll throughput with the transaction open, as a fraction of without it
RAW = "raw"

Row = list[str]


@dataclass
class Hold:
    """An open transaction that updated ``accounts``: where, its transaction id, when it opened/closed."""

    database: str
    xid: int
    opened: float
    closed: float = 0.0


@dataclass
class Phase:
    """A window of the latency run: events stamped in ``[start, end)`` belong to it."""

    name: str
    kind: str  # NONE, SAME or OTHER
    start: float
    end: float
    load: float  # 1-minute load average at its start
    hold: Hold | None = None


@dataclass
class Figures:
    """One reader's figures over some phases."""

    published: int
    received: int  # distinct events of the phases received
    p50: float  # ms
    p99: float
    max: float


@dataclass
class ReaderResult:
    """One kind of reader over the whole run (the records of its processes merged)."""

    name: str
    how: str
    published: int
    received: int  # events received, duplicates included
    distinct: int
    missing: int
    phases: dict[str, Figures] = field(default_factory=dict)  # by phase name
    kinds: dict[str, Figures] = field(default_factory=dict)  # by phase kind: its phases together

    @property
    def duplicates(self) -> int:
        return self.received - self.distinct

    @property
    def complete(self) -> bool:
        """Every event published received exactly once."""
        return self.missing == 0 and self.duplicates == 0

    def verdict(self, kind: str) -> bool | None:
        """Whether the reader meets the bar with the transaction open (``kind`` SAME or OTHER): every event
        once, and p99 at most ``BAR_MS`` above p99 without; None if that kind did not run."""
        if kind not in self.kinds or NONE not in self.kinds:
            return None
        held, free = self.kinds[kind], self.kinds[NONE]
        return self.complete and held.received == held.published and held.p99 <= free.p99 + BAR_MS


def figures(records: Sequence[Record], stamps: Sequence[float], phases: Sequence[Phase]) -> Figures:
    """Figures of the events stamped within any of ``phases`` (first receipt of each)."""
    def within(stamp: float) -> bool:
        return any(ph.start <= stamp < ph.end for ph in phases)

    published = sum(1 for s in stamps if within(s))
    first: dict[int, float] = {}
    for seq, stamp, latency in records:
        if seq not in first and within(stamp):
            first[seq] = latency
    lat = list(first.values())
    ms = 1000.0
    return Figures(published, len(first), percentile(lat, 50) * ms, percentile(lat, 99) * ms,
                   (max(lat) if lat else float("nan")) * ms)


def analyse(name: str, how: str, records: Sequence[Record], stamps: Sequence[float],
            phases: Sequence[Phase]) -> ReaderResult:
    """The figures of one kind of reader: per phase, per kind of phase, and over the whole run."""
    seqs = {r[0] for r in records}
    published = len(stamps)
    res = ReaderResult(name, how, published, len(records), len(seqs),
                       missing=sum(1 for s in range(published) if s not in seqs))
    for ph in phases:
        res.phases[ph.name] = figures(records, stamps, [ph])
    for kind in dict.fromkeys(ph.kind for ph in phases):
        res.kinds[kind] = figures(records, stamps, [ph for ph in phases if ph.kind == kind])
    return res


@dataclass
class Series:
    """The rounds of one poll-throughput measurement."""

    name: str  # RAW or a phase kind
    how: str
    rates: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    short: list[str] = field(default_factory=list)  # rounds that stopped before the whole backlog

    @property
    def best(self) -> float:
        return max(self.rates, default=0.0)

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


def throughput_ok(series: Sequence[Series]) -> dict[str, bool]:
    """The bar of each series with a transaction open: whole backlog, best >= THROUGHPUT_FLOOR x without."""
    free = next(s for s in series if s.name == NONE)
    return {s.name: not s.short and s.best >= THROUGHPUT_FLOOR * free.best
            for s in series if s.name in (SAME, OTHER)}


# --------------------------------------------------------------------------------------------------------
# tables


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:,.1f}"  # NaN: no events


def _pair(f: Figures) -> str:
    return f"{_ms(f.p50)} / {_ms(f.p99)}"


def _mark(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "FAIL")


def latency_table(results: Sequence[ReaderResult], phases: Sequence[Phase]) -> tuple[Row, list[Row]]:
    """Per reader and phase: events published and received in the phase, p50, p99, max, load."""
    head = ["reader", "phase", "published", "received", "p50 ms", "p99 ms", "max ms", "load"]
    rows = []
    for res in results:
        for ph in phases:
            f = res.phases[ph.name]
            rows.append([res.name, ph.name, f"{f.published:,}", f"{f.received:,}", _ms(f.p50), _ms(f.p99),
                         _ms(f.max), f"{ph.load:.2f}"])
    return head, rows


def verdict_table(results: Sequence[ReaderResult], phases: Sequence[Phase]) -> tuple[Row, list[Row]]:
    """Per reader: p50 / p99 without the transaction (and the two p99s without it, a yardstick of the
    noise), with it open here and elsewhere, the differences of the p99s, every event once, the verdict."""
    nones = [ph for ph in phases if ph.kind == NONE]
    held = [k for k in (SAME, OTHER) if any(ph.kind == k for ph in phases)]
    where = {SAME: "same database", OTHER: "other database"}
    head = ["reader", "p50 / p99 ms, none"]
    if len(nones) > 1:
        head.append("p99 ms of each phase without")
    for k in held:
        head += [f"p50 / p99 ms, open in the {where[k]}", "p99 difference"]
    head += ["received / published (duplicates)", "result"]
    rows = []
    for res in results:
        free = res.kinds[NONE]
        row = [res.name, _pair(free)]
        if len(nones) > 1:
            row.append(" / ".join(_ms(res.phases[ph.name].p99) for ph in nones))
        for k in held:
            f = res.kinds[k]
            row += [_pair(f), f"{f.p99 - free.p99:+,.1f} ms"]
        oks = [res.verdict(k) for k in held]
        row += [f"{res.distinct:,} / {res.published:,} ({res.duplicates:,})",
                _mark(all(ok is True for ok in oks)) if oks else ""]
        rows.append(row)
    return head, rows


def throughput_table(series: Sequence[Series]) -> tuple[Row, list[Row]]:
    """Per series: best and median events/s, every round, x raw COPY-out, x without, loads, verdict."""
    by = {s.name: s for s in series}
    oks = throughput_ok(series)
    head = ["measurement", "best events/s", "median events/s", "rounds, events/s", "x raw", "x none",
            "load", ""]
    rows = []
    raw, free = by[RAW].best, by[NONE].best
    for s in series:
        rounds = ", ".join(f"{r:,.0f}" for r in s.rates) + (" *" if s.short else "")
        verdict = _mark(oks.get(s.name))
        rows.append([s.how, f"{s.best:,.0f}", f"{s.median:,.0f}", rounds,
                     f"{s.best / raw:.2f}" if raw else "-",
                     f"{s.best / free:.2f}" if free and s.name != RAW else "-",
                     ", ".join(f"{x:.2f}" for x in s.loads), verdict])
    return head, rows


def _numeric(rows: Sequence[Row], i: int) -> bool:
    cells = [r[i] for r in rows if r[i] not in ("", "-")]
    return bool(cells) and all(c[:1].isdigit() or c[:1] in "+-" for c in cells)


def print_table(title: str, head: Row, rows: list[Row], console: Console) -> None:
    """A rich table; columns of figures are right-aligned."""
    table = Table(title=title)
    for i, h in enumerate(head):
        table.add_column(h, justify="right" if _numeric(rows, i) else "left")
    for r in rows:
        table.add_row(*[c.replace("PASS", "[green]PASS[/green]").replace("FAIL", "[red]FAIL[/red]")
                        for c in r])
    console.print(table)


def markdown_table(head: Row, rows: list[Row]) -> str:
    """The same table in Markdown."""
    align = ["---:" if _numeric(rows, i) else "---" for i in range(len(head))]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
