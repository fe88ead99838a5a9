"""Helpers of the observability tests: servers started as subprocesses, their address read from the
line they print, and Prometheus text parsed into samples."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

TESTS = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "pgstreams.cli"]
_URL = re.compile(r"(http://[0-9.]+:\d+)")


class Server:
    """A server subprocess, its base address and what it printed on stderr so far."""

    def __init__(self, proc: subprocess.Popen[str], url: str, lines: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.lines = lines

    @property
    def output(self) -> str:
        return "".join(self.lines)


@contextmanager
def server(args: Sequence[str], ready: str, timeout: float = 60.0, env: dict[str, str] | None = None
           ) -> Iterator[Server]:
    """Run ``pgstreams ARGS`` until the block ends (SIGTERM, then kill); wait for the stderr line
    containing ``ready`` and an ``http://HOST:PORT`` address."""
    proc = subprocess.Popen([*CLI, *args], cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **(env or {})))
    lines: list[str] = []
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    url = None
    try:
        while url is None:
            try:
                line = q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {ready!r} line after {timeout}s: {''.join(lines)}") from None
            if line is None:
                raise AssertionError(f"the server exited ({proc.wait()}): {''.join(lines)}")
            if ready in line and (m := _URL.search(line)):
                url = m.group(1)
        yield Server(proc, url, lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def get(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text: (name, sorted labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value (``None`` when absent)."""
    return samples(text).get((name, tuple(sorted(labels.items()))))
