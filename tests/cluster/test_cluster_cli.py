"""``pgstreams cluster init|describe`` and the commands on topics with ``--dsn`` repeated, as real
subprocesses: bad input exits 2 with one error line and changes nothing. Events produced by the command
line are consumed by it with each key's events in the order they were produced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _cluster_helpers import KeyedRead, assert_key_order
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


def _keyed_lines(keys: int, rounds: int) -> str:
    """Input of ``produce -k : --json``: ``rounds`` lines per key, ``{"k", "n"}`` with ``n`` counting each
    key's lines from 0."""
    return "".join(f'k{i}:{json.dumps({"k": f"k{i}", "n": n})}\n' for n in range(rounds) for i in range(keys))


def _consume_in_key_order(dsns: list[str], topic: str, group: str, rounds: int) -> list[dict[str, object]]:
    """``consume`` of ``topic`` over the cluster: its JSON lines, each key's events checked to be read in
    the order they were produced (:func:`assert_key_order`)."""
    lines = _ok("consume", topic, "-g", group, *_dsn_args(dsns), "--wait", "30").splitlines()
    consumed = [json.loads(line) for line in lines]
    assert_key_order([KeyedRead(e["key"], e["shard"], e["partition"], 0, e["value"]["n"]) for e in consumed],
                     rounds)
    return consumed


def test_cluster_init_describe_and_topics_over_repeated_dsns(shard_dsns: list[str]) -> None:
    created = json.loads(_ok("cluster", "init", *shard_dsns, "--json"))
    assert created["action"] == "created" and len(created["shards"]) == 3
    assert "already so" in _ok("cluster", "init", *shard_dsns)
    assert "created topic 'orders'" in _ok("topics", "create", "orders", "-p", "2", *_dsn_args(shard_dsns))
    _ok("produce", "orders", "-k", ":", "--json", *_dsn_args(shard_dsns), stdin=_keyed_lines(10, 3))
    described = json.loads(_ok("topics", "describe", "orders", "--json", *_dsn_args(shard_dsns)))
    assert described["span"] == 3 and described["events"] == 30 and len(described["shards"]) == 3
    consumed = _consume_in_key_order(shard_dsns, "orders", "cli", 3)  # every key's 3 events, in order
    assert len(consumed) == 30
    assert {e["shard"] for e in consumed} == {0, 1, 2}
    # PGSTREAMS_DSN with the shards separated by commas
    shown = json.loads(_ok("cluster", "describe", "--json", env={"PGSTREAMS_DSN": ",".join(shard_dsns)}))
    assert shown["cluster_id"] == created["cluster_id"]
    assert [s["topics"] for s in shown["shards"]] == [{"orders": 3}] * 3
    assert "orders" in _ok("topics", "list", env={"PGSTREAMS_DSN": ",".join(shard_dsns)})
    # one --dsn holding the shards separated by commas, as connect() accepts it
    listed = json.loads(_ok("topics", "describe", "orders", "--json", "--dsn", ",".join(shard_dsns)))
    assert listed["span"] == 3 and len(listed["shards"]) == 3


def test_bad_cluster_input_exits_2_and_changes_nothing(shard_dsns: list[str]) -> None:
    before = [db_state(d) for d in shard_dsns]
    assert "at least two DSNs" in _fails(2, "cluster", "init", shard_dsns[0])
    assert "same database" in _fails(2, "cluster", "init", shard_dsns[0], shard_dsns[0])
    assert "invalid --dsn" in _fails(2, "cluster", "init", shard_dsns[0], "host=x =bad")
    assert [db_state(d) for d in shard_dsns] == before
    _ok("cluster", "init", *shard_dsns)
    _ok("topics", "create", "t", "-p", "2", *_dsn_args(shard_dsns))
    _ok("produce", "t", "-k", ":", "--json", *_dsn_args(shard_dsns), stdin=_keyed_lines(10, 3))
    before = [db_state(d) for d in shard_dsns]
    line = _fails(1, "topics", "list", *_dsn_args([shard_dsns[1], shard_dsns[0], shard_dsns[2]]))
    assert "is shard 1 of cluster" in line
    assert "works on one server" in _fails(2, "groups", "list", *_dsn_args(shard_dsns))
    assert "at least two DSNs" in _fails(2, "cluster", "init", shard_dsns[0])
    assert [db_state(d) for d in shard_dsns] == before
    assert len(_consume_in_key_order(shard_dsns, "t", "cli", 3)) == 30  # every key's events, in order
