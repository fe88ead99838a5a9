"""Argument checks shared by the runtime's configuration values."""

from __future__ import annotations

import math

from ..errors import InvalidArgument


def number(name: str, value: object, *, low: float = 0.0, allow_low: bool = True) -> float:
    """``value`` as a finite float ``>= low`` (``> low`` unless ``allow_low``), else
    :class:`InvalidArgument`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            value < low if allow_low else value <= low):
        raise InvalidArgument(f"{name} must be a number {'>=' if allow_low else '>'} {low:g}, got {value!r}")
    return float(value)


def integer(name: str, value: object, low: int = 1) -> int:
    """``value`` as an int ``>= low`` (default 1), else :class:`InvalidArgument`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgument(f"{name} must be an integer >= {low}, got {value!r}")
    return value
