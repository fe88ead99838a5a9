"""connect(): where the DSN comes from, where the embedded server keeps its data, and closing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import pgstreams
from _core_helpers import run_async, wait_until
from pgstreams.embedded import home


def test_dsn_argument_else_pgstreams_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSTREAMS_DSN", dsn)
    with pgstreams.connect() as client:
        assert client.dsn == dsn
        client.create_topic("from-env")
    # the argument wins over the environment
    monkeypatch.setenv("PGSTREAMS_DSN", "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    with pgstreams.connect(dsn) as client:
        assert [t.name for t in client.list_topics()] == ["from-env"]
    # the command line too: no --dsn, PGSTREAMS_DSN set
    env = {k: v for k, v in os.environ.items() if k != "PGSTREAMS_DEBUG"}
    env["PGSTREAMS_DSN"] = dsn
    proc = subprocess.run([sys.executable, "-m", "pgstreams.cli", "topics", "list", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [t["name"] for t in json.loads(proc.stdout)] == ["from-env"]


def test_leaving_the_with_block_closes_the_client(dsn: str) -> None:
    def others(probe: psycopg.Connection) -> int:
        row = probe.execute("SELECT count(*) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
        return int(row[0]) if row else 0

    with psycopg.connect(dsn, autocommit=True) as probe:
        assert others(probe) == 0
        with pgstreams.connect(dsn) as client:
            client.create_topic("t")
            client.publish("t", 1)
            consumer = client.consumer("t", "g")
            consumer.poll(timeout=0.1)  # starts the listener too
            assert others(probe) >= 2
        wait_until(lambda: others(probe) == 0, 10, "the client's connections to close")
    # a closed client, and what it made, say so at once (no retry: nothing brings a closed client back)
    for use in (client.list_topics, lambda: client.publish("t", 2), lambda: consumer.poll(timeout=0)):
        with pytest.raises(pgstreams.ClientClosed, match="the client is closed"):
            use()


def test_embedded_data_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PGSTREAMS_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert home() == tmp_path / "user" / ".local" / "share" / "pgstreams"  # the user's data directory
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home() == tmp_path / "xdg" / "pgstreams"
    monkeypatch.setenv("PGSTREAMS_HOME", str(tmp_path / "mine"))
    assert home() == tmp_path / "mine"  # PGSTREAMS_HOME overrides


def test_every_connection_of_a_client_runs_without_jit(dsn: str) -> None:
    """JIT compilation of a poll's generic plan over many segments cost 60 to 80 ms a poll: pgstreams'
    connections (pooled, its own, the async client's) have it off."""

    from psycopg.conninfo import make_conninfo

    from pgstreams import aio

    dsn = make_conninfo(dsn, options="-c jit=on")  # as a server whose default is on
    with psycopg.connect(dsn) as plain:
        assert plain.execute("SHOW jit").fetchone() == ("on",)
    with pgstreams.connect(dsn) as client:
        with client.connection() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)
        with client.raw_connection() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)

    async def run() -> tuple[object, object]:
        async with await aio.connect(dsn) as ac:
            async with ac.connection() as conn:
                pooled = await (await conn.execute("SHOW jit")).fetchone()
            await ac.create_topic("t")
            await ac.publish("t", 1)  # makes the client's own connection
            assert ac._own is not None
            own = await (await ac._own.execute("SHOW jit")).fetchone()
            return pooled, own

    assert run_async(run) == (("off",), ("off",))
