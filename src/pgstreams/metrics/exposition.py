"""Prometheus' text format (0.0.4), rendered faster than ``prometheus_client.generate_latest``.

``generate_latest`` checks and escapes every metric and label name of every sample (about 25 us per
sample here): at 1,000 topics a scrape has some 7,700 samples, 0.1 to 0.2 s of formatting. The names of
pgstreams' metrics are fixed and valid, so :func:`render` checks each family's name and each distinct set
of label names once, formats the samples with plain string operations, and gives byte for byte the same
text as ``generate_latest`` (a test compares them). A family it does not handle the same way (a name
outside Prometheus' classic character set, a type with its own munging) is rendered by
``generate_latest`` itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

#: Prometheus' classic metric and label names (what ``generate_latest`` leaves as they are).
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: Label values: backslash, newline and double quote escaped (as ``generate_latest`` does).
_VALUE_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", '"': '\\"'})
#: The samples ``generate_latest`` moves to gauges of their own after a family's other samples.
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
#: The types rendered here (their names munged as ``generate_latest`` does): counter gets ``_total``.
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
          "unknown": "untyped"}


class FastFamily(Metric):
    """A gauge or counter family whose samples are kept with their label text already escaped, so that
    :func:`render` writes each as one line without building a sample. ``samples`` builds the samples on
    access (``generate_latest`` and any other reader see an ordinary family)."""

    def __init__(self, name: str, documentation: str, typ: str, labelnames: tuple[str, ...]) -> None:
        if typ not in ("gauge", "counter"):
            raise ValueError(f"a FastFamily is a gauge or a counter, not {typ!r}")
        super().__init__(name, documentation, typ)
        self._labelnames = labelnames
        self._sample_name = name + "_total" if typ == "counter" else name
        #: names in Prometheus' classic character set (else :func:`render` leaves it to generate_latest)
        self.plain = bool(_NAME.match(name)) and all(_LABEL.match(k) for k in labelnames)
        #: (label values, their text: ``k="v",...`` in key order, escaped; value)
        self._rows: list[tuple[tuple[str, ...], str, float]] = []

    @property
    def samples(self) -> list[Sample]:
        return [Sample(self._sample_name, dict(zip(self._labelnames, values, strict=True)), value, None, None)
                for values, _, value in self._rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:  # Metric.__init__ sets [], the rows are the samples
        pass

    def add(self, values: tuple[str, ...], value: float, text: str | None = None) -> None:
        """A sample with label ``values`` (in ``labelnames`` order) and ``value``; ``text``, when given,
        is their label text as :func:`label_text` makes it (shared by families with the same labels)."""
        self._rows.append((values, text if text is not None else label_text(self._labelnames, values),
                           value))

    def exposition(self) -> str:
        """This family in the text format (as ``generate_latest`` writes it)."""
        sample = self._sample_name
        out = [_header(sample, self.documentation, self.type)]
        out.extend(f"{sample}{{{text}}} {floatToGoString(value)}\n" if text else
                   f"{sample} {floatToGoString(value)}\n" for _, text, value in self._rows)
        return "".join(out)


def label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """The label text of a sample: ``name="value"`` pairs in name order, values escaped."""
    return _label_body(zip(names, values, strict=True))


def _label_body(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v.translate(_VALUE_ESCAPES)}"' for k, v in sorted(pairs))


def _header(name: str, documentation: str, typ: str) -> str:
    """A family's ``# HELP`` and ``# TYPE`` lines (its help text escaped as ``generate_latest`` does)."""
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"


class _Single:
    """A collector of one family, to have ``generate_latest`` render it."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self._metric]


def _family(metric: Metric, checked: set[frozenset[str]]) -> str | None:
    """``metric`` in the text format, or None when :func:`render` leaves it to ``generate_latest``."""
    mtype = _TYPES.get(metric.type)
    if mtype is None or not _NAME.match(metric.name):
        return None
    mname = metric.name + "_total" if metric.type == "counter" else metric.name
    out = [_header(mname, metric.documentation, mtype)]
    moved: dict[str, list[str]] = {}
    moved_names = {metric.name + suffix: suffix for suffix in _OPENMETRICS_SUFFIXES}
    for s in metric.samples:
        if not _NAME.match(s.name):
            return None
        labels = s.labels
        if labels:
            keys = frozenset(labels)
            if keys not in checked:
                if not all(_LABEL.match(k) for k in keys):
                    return None
                checked.add(keys)
            line = f"{s.name}{{{_label_body(labels.items())}}} {floatToGoString(s.value)}"
        else:
            line = f"{s.name} {floatToGoString(s.value)}"
        if s.timestamp is not None:
            line += f" {int(float(s.timestamp) * 1000):d}"
        line += "\n"
        suffix = moved_names.get(s.name)
        if suffix is None:
            out.append(line)
        else:
            moved.setdefault(suffix, []).append(line)
    for suffix, lines in sorted(moved.items()):
        out.append(_header(metric.name + suffix, metric.documentation, "gauge"))
        out.extend(lines)
    return "".join(out)


def render(registry: Collector) -> bytes:
    """The metrics of ``registry`` (any collector) in Prometheus' text format, UTF-8: the same bytes as
    ``prometheus_client.generate_latest(registry)``, faster."""
    parts: list[str] = []
    checked: set[frozenset[str]] = set()
    for metric in registry.collect():
        if isinstance(metric, FastFamily) and metric.plain:
            parts.append(metric.exposition())
            continue
        text = _family(metric, checked)
        parts.append(text if text is not None else generate_latest(_Single(metric)).decode())
    return "".join(parts).encode("utf-8")
