"""CPU accounting of benchmark processes: each child measures, over its own timed loop, the CPU time of
its process (user + system, all threads: :func:`os.times`) and the busy time of the whole machine
(``/proc/stat``: every process, the database server and the broker included).

:func:`metered` wraps an operation factory of :mod:`bench._common` so that the child's result carries
both (as ``extra``); :func:`cpu_of` adds up the children of one measurement.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .._common import DONE, ChildResult, Factory

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy() -> float | None:
    """Seconds of CPU the machine has been busy since boot, over all cores (``/proc/stat``: user, nice,
    system, irq, softirq, steal); ``None`` where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def process_cpu() -> float:
    """Seconds of CPU (user + system) this process has used, all threads."""
    t = os.times()
    return t.user + t.system


@dataclass(frozen=True)
class Metered:
    """An operation to meter: ``factory(arg)``, called ``warmup`` times before the timed loop (inside the
    child's set-up, so the warm-up is neither timed nor metered); with a ``limit``, the child stops once
    its timed loop has handled that many events."""

    factory: Factory
    arg: Any
    warmup: int = 0
    limit: int = 0


class _Meter:
    """Calls ``inner`` (until ``limit`` events, if given); remembers the CPU clocks at the first call. Its
    ``extra`` (read by the child after its timed loop) is ``{"client_cpu": s, "machine_cpu": s, "inner":
    inner's own extra}``."""

    def __init__(self, inner: Callable[[], int], limit: int = 0) -> None:
        self.inner = inner
        self.limit = limit
        self.count = 0
        self.start: tuple[float, float | None] | None = None

    def __call__(self) -> int:
        if self.start is None:
            self.start = (process_cpu(), machine_busy())
        if self.limit and self.count >= self.limit:
            return DONE
        n = self.inner()
        if n > 0:
            self.count += n
        return n

    @property
    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"inner": getattr(self.inner, "extra", None)}
        if self.start is not None:
            busy = machine_busy()
            out["client_cpu"] = process_cpu() - self.start[0]
            out["machine_cpu"] = None if busy is None or self.start[1] is None else busy - self.start[1]
        return out


@contextmanager
def metered(spec: Metered) -> Iterator[Callable[[], int]]:
    """Operation: ``spec.factory(spec.arg)``'s, warmed up, with CPU accounting (see :class:`_Meter`)."""
    with spec.factory(spec.arg) as inner:
        for _ in range(spec.warmup):
            inner()
        yield _Meter(inner, spec.limit)


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of one measurement: of its own processes, and of the whole machine."""

    client: float | None
    machine: float | None


def cpu_of(results: Sequence[ChildResult]) -> Cpu:
    """The client CPU (sum over the processes) and machine CPU (mean of what each process saw: their timed
    loops run together) of a metered measurement."""
    extras = [r.extra for r in results if isinstance(r.extra, dict) and "client_cpu" in r.extra]
    if not extras:
        return Cpu(None, None)
    machines = [e["machine_cpu"] for e in extras if e.get("machine_cpu") is not None]
    return Cpu(sum(e["client_cpu"] for e in extras), sum(machines) / len(machines) if machines else None)
