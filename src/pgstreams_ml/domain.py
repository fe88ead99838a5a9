"""The simulated world: entity domains, the feature spec shared by every stage, and the hidden ground truth.

The click probability of an impression is ``sigmoid(intercept + sum(coef[f] * x[f]))`` over the features of
:data:`FEATURES`, computed from the user's profile and the ad's catalogue entry *as of the impression* and
the impression's context (slot, device). Every one of those inputs reaches the pipelines (profiles and
catalogue through the enrichment store, context in the impression), so a logistic regression on
:data:`FEATURES` can in principle match the oracle; what separates them is only estimation error.

Two regimes exist: ``0`` before the drift switch and ``1`` after it. Regime 1 changes the coefficients
(concept drift) and the mix of devices and ad categories shown (feature drift).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Countries a user can live in (the first is the one-hot base level).
COUNTRIES: tuple[str, ...] = ("US", "CA", "MX", "GB", "DE")
#: Devices an impression can be shown on (the first is the base level).
DEVICES: tuple[str, ...] = ("mobile", "desktop", "tablet")
#: Ad categories (the first is the base level).
CATEGORIES: tuple[str, ...] = ("electronics", "fashion", "travel", "food", "finance", "games")
#: Ad slots on a page, 1 = top (the base level).
SLOTS: tuple[int, ...] = (1, 2, 3, 4)
#: Price at which ``log_price`` is 0.
PRICE_REF = 50.0


@dataclass(frozen=True)
class Feature:
    """One model feature: ``kind`` is ``num`` (``transform`` of column ``source``), ``onehot`` (1.0 when
    ``source == level``) or ``match`` (1.0 when ``source == other``)."""

    name: str
    kind: str
    source: str
    level: Any = None
    other: str | None = None
    transform: str = "identity"  # identity | log_price | age_c


def _build() -> tuple[Feature, ...]:
    out = [
        Feature("activity", "num", "activity"),
        Feature("quality", "num", "quality"),
        Feature("log_price", "num", "price", transform="log_price"),
        Feature("age_c", "num", "age", transform="age_c"),
        Feature("fav_match", "match", "category", other="fav_category"),
    ]
    out += [Feature(f"slot_{s}", "onehot", "slot", level=s) for s in SLOTS[1:]]
    out += [Feature(f"device_{d}", "onehot", "device", level=d) for d in DEVICES[1:]]
    out += [Feature(f"cat_{c}", "onehot", "category", level=c) for c in CATEGORIES[1:]]
    out += [Feature(f"country_{c}", "onehot", "country", level=c) for c in COUNTRIES[1:]]
    return tuple(out)


#: The model features, in vector order.
FEATURES: tuple[Feature, ...] = _build()
#: Their names, in vector order.
FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)
#: The raw inputs the features are computed from (profile, catalogue and impression context).
RAW_INPUTS: tuple[str, ...] = (
    "activity",
    "quality",
    "price",
    "age",
    "category",
    "fav_category",
    "slot",
    "device",
    "country",
)
#: Categorical inputs monitored for feature drift, with their domains.
DRIFT_CATEGORICAL: dict[str, tuple[Any, ...]] = {
    "device": DEVICES,
    "category": CATEGORIES,
    "slot": SLOTS,
    "country": COUNTRIES,
}
#: Numeric inputs monitored for feature drift, with their bucket edges.
DRIFT_NUMERIC: dict[str, tuple[float, ...]] = {
    "activity": (0.2, 0.4, 0.6, 0.8),
    "quality": (0.2, 0.4, 0.6, 0.8),
    "price": (10.0, 25.0, 50.0, 100.0, 200.0),
}


def _transform(name: str, v: float) -> float:
    if name == "log_price":
        return math.log(max(v, 0.01) / PRICE_REF)
    if name == "age_c":
        return (v - 40.0) / 10.0
    return v


def feature_vector(row: Mapping[str, Any]) -> list[float]:
    """The feature vector (order of :data:`FEATURE_NAMES`) of a mapping holding :data:`RAW_INPUTS`."""
    out = []
    for f in FEATURES:
        if f.kind == "num":
            out.append(_transform(f.transform, float(row[f.source])))
        elif f.kind == "onehot":
            out.append(1.0 if row[f.source] == f.level else 0.0)
        else:
            out.append(1.0 if row[f.source] == row[f.other or ""] else 0.0)
    return out


def drift_bucket(name: str, value: Any) -> str:
    """The bucket label of input ``name`` for drift statistics (the value itself for categoricals)."""
    if name in DRIFT_CATEGORICAL:
        return str(value)
    edges = DRIFT_NUMERIC[name]
    v = float(value)
    for i, e in enumerate(edges):
        if v < e:
            return f"b{i}"
    return f"b{len(edges)}"


def sigmoid(z: float) -> float:
    """The logistic function, overflow-safe."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True)
class Regime:
    """One ground-truth regime: coefficients per feature plus the context mix the simulator draws."""

    intercept: float
    coef: Mapping[str, float]
    device_mix: tuple[float, ...]
    category_mix: tuple[float, ...]

    def logit(self, x: list[float]) -> float:
        """The true log-odds of a click for feature vector ``x``."""
        return self.intercept + sum(self.coef.get(n, 0.0) * v for n, v in zip(FEATURE_NAMES, x, strict=True))

    def probability(self, row: Mapping[str, Any]) -> float:
        """The true click probability of an impression described by ``row`` (:data:`RAW_INPUTS`)."""
        return sigmoid(self.logit(feature_vector(row)))


#: Regime 0: before the drift switch.
REGIME_BEFORE = Regime(
    intercept=-3.9,
    coef={
        "activity": 2.2,
        "quality": 1.8,
        "log_price": -0.55,
        "age_c": -0.2,
        "fav_match": 1.3,
        "slot_2": -0.35,
        "slot_3": -0.7,
        "slot_4": -1.05,
        "device_desktop": -0.25,
        "device_tablet": -0.45,
        "cat_fashion": 0.25,
        "cat_travel": -0.35,
        "cat_food": 0.45,
        "cat_finance": -0.6,
        "cat_games": 0.3,
        "country_CA": -0.1,
        "country_MX": 0.25,
        "country_GB": -0.2,
        "country_DE": -0.3,
    },
    device_mix=(0.6, 0.3, 0.1),
    category_mix=(1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
)

#: Regime 1: after the drift switch (tastes reverse, more tablets, travel and finance ads pushed).
REGIME_AFTER = Regime(
    intercept=-1.7,
    coef={
        "activity": -1.6,
        "quality": 0.3,
        "log_price": 0.7,
        "age_c": 0.3,
        "fav_match": 1.8,
        "slot_2": -0.3,
        "slot_3": -0.6,
        "slot_4": -0.9,
        "device_desktop": 0.2,
        "device_tablet": 0.6,
        "cat_fashion": -0.5,
        "cat_travel": 0.7,
        "cat_food": -0.4,
        "cat_finance": 0.35,
        "cat_games": -0.3,
        "country_CA": 0.1,
        "country_MX": -0.2,
        "country_GB": 0.2,
        "country_DE": 0.1,
    },
    device_mix=(0.35, 0.25, 0.4),
    category_mix=(0.6, 0.6, 2.0, 0.6, 1.6, 0.6),
)

#: The regimes by number.
REGIMES: tuple[Regime, ...] = (REGIME_BEFORE, REGIME_AFTER)
