"""``pgstreams cluster init|describe`` and the commands on topics with ``--dsn`` repeated, as real
subprocesses: bad input exits 2 with one error line and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from _core_helpers import db_state

TIMEOUT = 120


def _run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PGSTREAMS_DSN", "PGSTREAMS_DEBUG")}
    return subprocess.run([sys.executable, "-m", "pgstreams.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env={**base, "COLUMNS": "200", **(env or {})}, input=stdin)


def _ok(*args: str, **kw: object) -> str:
    p = _run(*args, **kw)  # type: ignore[arg-type]
    assert p.returncode == 0, f"{args}: exit {p.returncode}\n{p.stderr}"
    assert "Traceback" not in p.stderr
    return p.stdout


def _fails(code: int, *args: str, **kw: object) -> str:
    p = _run(*args, **kw)  # type: ignore[arg-type]
    assert p.returncode == code, f"{args}: exit {p.returncode}, wanted {code}\n{p.stderr}"
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def _dsn_args(dsns: list[str]) -> list[str]:
    return [a for d in dsns for a in ("--dsn", d)]


def test_cluster_init_describe_and_topics_over_repeated_dsns(shard_dsns: list[str]) -> None:
    created = json.loads(_ok("cluster", "init", *shard_dsns, "--json"))
    assert created["action"] == "created" and len(created["shards"]) == 3
    assert "already so" in _ok("cluster", "init", *shard_dsns)
    assert "created topic 'orders'" in _ok("topics", "create", "orders", "-p", "2", *_dsn_args(shard_dsns))
    lines = "".join(f"k{i}:v{i}\n" for i in range(30))
    _ok("produce", "orders", "-k", ":", *_dsn_args(shard_dsns), stdin=lines)
    described = json.loads(_ok("topics", "describe", "orders", "--json", *_dsn_args(shard_dsns)))
    assert described["span"] == 3 and described["events"] == 30 and len(described["shards"]) == 3
    consumed = [json.loads(line) for line in _ok("consume", "orders", "-g", "cli", *_dsn_args(shard_dsns),
                                                 "--wait", "30").splitlines()]
    assert sorted(e["value"] for e in consumed) == sorted(f"v{i}" for i in range(30))
    assert {e["shard"] for e in consumed} == {0, 1, 2}
    # PGSTREAMS_DSN with the shards separated by commas
    shown = json.loads(_ok("cluster", "describe", "--json", env={"PGSTREAMS_DSN": ",".join(shard_dsns)}))
    assert shown["cluster_id"] == created["cluster_id"]
    assert [s["topics"] for s in shown["shards"]] == [{"orders": 3}] * 3
    assert "orders" in _ok("topics", "list", env={"PGSTREAMS_DSN": ",".join(shard_dsns)})


def test_bad_cluster_input_exits_2_and_changes_nothing(shard_dsns: list[str]) -> None:
    before = [db_state(d) for d in shard_dsns]
    assert "at least two DSNs" in _fails(2, "cluster", "init", shard_dsns[0])
    assert "same database" in _fails(2, "cluster", "init", shard_dsns[0], shard_dsns[0])
    assert "invalid --dsn" in _fails(2, "cluster", "init", shard_dsns[0], "host=x =bad")
    assert [db_state(d) for d in shard_dsns] == before
    _ok("cluster", "init", *shard_dsns)
    line = _fails(1, "topics", "list", *_dsn_args([shard_dsns[1], shard_dsns[0], shard_dsns[2]]))
    assert "is shard 1 of cluster" in line
    assert "works on one server" in _fails(2, "groups", "list", *_dsn_args(shard_dsns))
    with psycopg.connect(shard_dsns[0]) as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.topics").fetchone() == (0,)
