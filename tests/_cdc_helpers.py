"""Helpers of the change data capture tests: reading a capture's topics, applying its events to a copy of
a table, and a capturer process that stops dead at a chosen point of a round (run as a script:
``python tests/_cdc_helpers.py DSN CAPTURE POINT NTH MARKER``)."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import pgstreams


def sql(dsn: str, *statements: str) -> None:
    """Run ``statements`` on ``dsn``, each in its own transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)  # type: ignore[arg-type]


class WriterThreads:
    """Threads that call :meth:`write` (a change or a transaction on ``conn``, with a random generator of
    the thread's own) over and over until :meth:`finish`, which fails when one of them raised. Subclasses
    set their own attributes before calling ``__init__`` (the threads start there)."""

    #: whether the threads' connections are in autocommit mode
    autocommit = False

    def __init__(self, dsn: str, count: int = 3) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        raise NotImplementedError

    def _run(self, seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with psycopg.connect(self.dsn, autocommit=self.autocommit) as conn:
                while not self.stop.is_set():
                    self.write(conn, rnd)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.failures.append(exc)

    def finish(self) -> None:
        """Stop the threads and wait for them; fail if one raised."""
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.failures


def all_events(client: pgstreams.Client, topic: str) -> list[pgstreams.Event]:
    """Every committed event of ``topic``, partition by partition, in read order."""
    out: list[pgstreams.Event] = []
    for p in range(client.describe_topic(topic).topic.partitions):
        position: int | None = None
        while True:
            got = client.read_events(topic, p, position=position, limit=1000)
            out.extend(got)
            if len(got) < 1000:
                break
            position = got[-1].position + 1
    return out


def apply(events: list[pgstreams.Event], copy: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Apply change events to ``copy`` (key -> row), as a consumer keeping a copy of the table would."""
    for ev in events:
        v = ev.value
        assert isinstance(v, dict)
        if v["op"] in ("c", "r", "u"):
            assert ev.key is not None
            copy[ev.key] = v["after"]
        elif v["op"] == "d":
            assert ev.key is not None
            copy.pop(ev.key, None)
        elif v["op"] == "t":
            copy.clear()
    return copy


def table_rows(dsn: str, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """The rows of ``table`` (columns as JSON: to compare with a copy built from events), by key."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(psycopg.sql.SQL("SELECT to_jsonb(t) FROM {} t").format(
            psycopg.sql.Identifier(table))).fetchall()
    return {json.dumps({key: r[0][key]}, separators=(",", ":")): r[0] for r in rows}


def _stop_at(dsn: str, name: str, point: str, nth: int, marker: Path) -> None:
    """Capture ``name`` until the ``nth`` time a round reaches ``point``; then write ``marker`` and wait
    to be killed."""
    seen = 0

    def step(at: str) -> None:
        nonlocal seen
        if at == point:
            seen += 1
            if seen >= nth:
                marker.write_text(at)
                while True:
                    time.sleep(1)

    client = pgstreams.connect(dsn)
    capturer = client.cdc.capturer(name, batch=50)
    capturer.on_step = step
    while not capturer.acquire():
        time.sleep(0.05)
    while True:
        if not capturer.round().more:
            time.sleep(0.02)


if __name__ == "__main__":
    _stop_at(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
