"""The ``pgstreams`` command line, run as real subprocesses against a real PostgreSQL."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgstreams

TIMEOUT = 120


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PGSTREAMS_DSN", "PGSTREAMS_DEBUG"):
        env.pop(name, None)
    env["COLUMNS"] = "200"
    return env


def cli(dsn: str | None, *args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pgstreams.cli ARGS --dsn DSN`` and return the finished process (text output)."""
    cmd = [sys.executable, "-m", "pgstreams.cli", *args]
    if dsn is not None:
        cmd += ["--dsn", dsn]
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(cmd, input=data, capture_output=True, timeout=TIMEOUT, env=_env())
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def ok(dsn: str | None, *args: str, stdin: str | bytes | None = None) -> str:
    """Run a command that must succeed; return its stdout."""
    p = cli(dsn, *args, stdin=stdin)
    assert p.returncode == 0, f"{args}: exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr
    return p.stdout


def fails(dsn: str | None, code: int, *args: str, stdin: str | None = None) -> str:
    """Run a command that must fail with ``code``, one ``error:`` line on stderr and no traceback."""
    p = cli(dsn, *args, stdin=stdin)
    assert p.returncode == code, f"{args}: exit {p.returncode}, wanted {code}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def consume(dsn: str, topic: str, group: str, *extra: str) -> list[dict[str, Any]]:
    # a long --wait: events held back by other tests' open transactions are still waited for
    out = ok(dsn, "consume", topic, "--group", group, "--wait", "60", *extra)
    return [json.loads(line) for line in out.splitlines()]


def group_json(dsn: str, group: str) -> list[dict[str, Any]]:
    return list(json.loads(ok(dsn, "groups", "describe", group, "--json")))


# -- basics ------------------------------------------------------------------------------------------
def test_help_version_and_console_script() -> None:
    assert "topics" in ok(None, "--help")
    assert ok(None, "--version").strip() == f"pgstreams {pgstreams.__version__}"
    for sub in ("topics", "groups", "produce", "consume", "migrate", "quickstart"):
        shown = ok(None, sub, "--help")
        assert "--help" in shown
        # no type beside flags, no Python type names: the help shows what to type
        assert "<bool>" not in shown and "<list[" not in shown
    no_args = cli(None)
    assert no_args.returncode == 2 and "Usage" in no_args.stdout + no_args.stderr
    script = Path(sys.executable).parent / "pgstreams"
    if script.exists():
        p = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=TIMEOUT,
                           env=_env())
        assert p.returncode == 0 and pgstreams.__version__ in p.stdout



# -- commands of applications (the pgstreams.commands entry point group) -------------------------------
def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_application_commands_come_from_entry_points() -> None:
    listed = ok(None, "--help")
    assert "demo" in listed and "sim" in listed  # added by the ML application's entry point
    demo_help = ok(None, "demo", "--help")
    for option in ("--reports", "--duration", "--seed", "--scorers", "--strict"):
        assert option in demo_help
    assert "--drift-at" in ok(None, "sim", "--help")
    # the ML application's missing extra is one clear line and exit 1, not a traceback
    script = ("import sys; sys.modules['pyspark'] = None; sys.argv = ['pgstreams', 'demo']; "
              "from pgstreams.cli import main; main()")
    p = _run([sys.executable, "-c", script], _env())
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: missing pyspark") and "pgstreams[ml]" in lines[0]
    # the application's own command line reports errors as the core one does (run_app)
    p = _run([sys.executable, "-m", "pgstreams_ml", "sim", "--duration", "soon"], _env())
    assert p.returncode == 2 and p.stderr.startswith("error: --duration") and len(p.stderr.splitlines()) == 1


def test_an_application_that_fails_to_load_leaves_the_other_commands_working(tmp_path: Path) -> None:
    dist = tmp_path / "extra_commands-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-commands\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[pgstreams.commands]\nbroken = no_such_module_zz:add\nhello = hello_commands:add\n")
    (tmp_path / "hello_commands.py").write_text(
        "import typer\n\n"
        "def hello(name: str = 'world') -> None:\n"
        "    \"\"\"Greet someone.\"\"\"\n"
        "    print(f'hello {name}')\n\n"
        "def add(app: typer.Typer) -> None:\n"
        "    app.command('hello')(hello)\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pgstreams.cli"]
    p = _run([*cmd, "--help"], env)
    assert p.returncode == 0 and p.stderr == ""
    assert "Greet someone." in p.stdout and "topics" in p.stdout
    p = _run([*cmd, "hello", "--name", "you"], env)
    assert (p.returncode, p.stdout, p.stderr) == (0, "hello you\n", "")
    p = _run([*cmd, "topics", "create", "--help"], env)
    assert p.returncode == 0 and p.stderr == ""
    # the broken one is reported, in one line, when a command it might have added is used
    p = _run([*cmd, "nosuch"], env)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: No such command 'nosuch'") and "'broken'" in line
    assert "no_such_module_zz" in line

def test_migrate_and_status(empty_dsn: str) -> None:
    pending = json.loads(ok(empty_dsn, "migrate", "--status", "--json"))
    assert pending and all(m["applied_at"] is None for m in pending)
    assert "pending" in ok(empty_dsn, "migrate", "--status")
    first = json.loads(ok(empty_dsn, "migrate", "--json"))
    assert first["applied"] == [m["version"] for m in pending]
    assert "up to date" in ok(empty_dsn, "migrate")
    done = json.loads(ok(empty_dsn, "migrate", "--status", "--json"))
    assert all(m["applied_at"] is not None for m in done)
    assert "applied" in ok(empty_dsn, "migrate", "--schema", "other_schema")
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('other_schema.topics') IS NOT NULL").fetchone() == (True,)
    # a schema migrated by a newer pgstreams: reported, nothing applied, exit 0
    future = max(m["version"] for m in done) + 1
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgstreams.migrations (version, name) VALUES (%s, 'later')", (future,))
    status = json.loads(ok(empty_dsn, "migrate", "--status", "--json"))
    assert [(m["version"], m["known"]) for m in status][-1] == (future, False)
    assert all(m["known"] for m in status[:-1])
    p = cli(empty_dsn, "migrate", "--json")
    assert p.returncode == 0 and json.loads(p.stdout) == {"schema": "pgstreams", "applied": [],
                                                         "version": future, "unknown": [future]}
    assert f"holds migrations {future}" in p.stderr and "newer" in p.stderr


def test_topics_lifecycle(dsn: str) -> None:
    out = ok(dsn, "topics", "create", "orders", "--partitions", "3")
    assert "created topic 'orders' (3 partitions)" in out
    assert "already exists" in ok(dsn, "topics", "create", "orders", "-p", "3")
    ok(dsn, "topics", "create", "single")
    listed = json.loads(ok(dsn, "topics", "list", "--json"))
    assert [(t["name"], t["partitions"]) for t in listed] == [("orders", 3), ("single", 1)]
    assert listed[0]["created_at"].endswith("+00:00")
    assert "orders" in ok(dsn, "topics", "list")
    ok(dsn, "produce", "orders", "-k", ":", stdin="a:1\nb:2\na:3\n")
    desc = json.loads(ok(dsn, "topics", "describe", "orders", "--json"))
    assert desc["events"] == 3 and [p["partition"] for p in desc["partition_info"]] == [0, 1, 2]
    assert sum(p["events"] for p in desc["partition_info"]) == 3
    table = ok(dsn, "topics", "describe", "orders")
    assert "3 events" in table and "head" in table
    assert "deleted topic 'orders'" in ok(dsn, "topics", "delete", "orders")
    assert fails(dsn, 1, "topics", "delete", "orders") == "error: topic 'orders' does not exist"
    ok(dsn, "topics", "delete", "orders", "--if-exists")
    assert [t["name"] for t in json.loads(ok(dsn, "topics", "list", "--json"))] == ["single"]
    assert "no topics" in ok(dsn, "topics", "list", "--schema", "elsewhere")


# -- produce and consume -----------------------------------------------------------------------------
def test_produce_consume_roundtrip_with_keys_and_json(dsn: str) -> None:
    ok(dsn, "topics", "create", "clicks", "-p", "3")
    lines = [("u1", {"ad": 1}), ("u2", [1, 2]), ("u1", "text"), ("u3", 42), ("u1", None), ("u2", {"x": "é"})]
    stdin = "".join(f"{k}\t{json.dumps(v)}\n" for k, v in lines)
    p = cli(dsn, "produce", "clicks", "--key-separator", "\t", "--json", stdin=stdin)
    assert p.returncode == 0 and "published 6 events" in p.stderr
    got = consume(dsn, "clicks", "readers")
    assert len(got) == 6
    for ev in got:
        assert ev["partition"] == pgstreams.partition_for_key(ev["key"], 3)
        assert set(ev) >= {"topic", "partition", "position", "txid", "key", "value", "value_type", "headers",
                           "event_type", "event_id", "correlation_id", "causation_id", "created_at"}
        assert ev["topic"] == "clicks" and ev["headers"] == {}
        assert ev["value_type"] == ("text" if isinstance(ev["value"], str) else "json")
    for key in ("u1", "u2", "u3"):
        assert [e["value"] for e in got if e["key"] == key] == [v for k, v in lines if k == key]
    # the checkpoint was committed: the same group reads nothing more
    assert consume(dsn, "clicks", "readers") == []


def test_produce_text_headers_and_bytes_rendering(dsn: str) -> None:
    ok(dsn, "topics", "create", "logs", "-p", "2")
    ok(dsn, "produce", "logs", "--partition", "1", "--event-type", "line", "-H", "src=app", "-H", "env=test",
       "--correlation-id", "c-1", stdin="first line\r\n\n{not json}\n")
    with pgstreams.connect(dsn) as client:
        client.publish("logs", b"\x00\xffraw", key="bin", partition=0)
    got = consume(dsn, "logs", "g")
    text = [e for e in got if e["partition"] == 1]
    assert [e["value"] for e in text] == ["first line", "{not json}"]  # blank line skipped, CR stripped
    assert all(e["value_type"] == "text" and e["event_type"] == "line" and e["correlation_id"] == "c-1"
               and e["headers"] == {"src": "app", "env": "test"} for e in text)
    (raw,) = [e for e in got if e["partition"] == 0]
    assert raw["value_type"] == "bytes" and base64.b64decode(raw["value"]) == b"\x00\xffraw"


def test_consume_max_commits_and_resumes(dsn: str) -> None:
    ok(dsn, "topics", "create", "t", "-p", "2")
    ok(dsn, "produce", "t", "-q", stdin="".join(f"{i}\n" for i in range(10)))
    first = consume(dsn, "t", "g", "--max", "4", "--batch-size", "3")
    assert len(first) == 4
    rest = consume(dsn, "t", "g")
    assert len(rest) == 6
    assert sorted(int(e["value"]) for e in first + rest) == list(range(10))
    assert consume(dsn, "t", "g") == []
    # another group is independent and replays everything
    assert len(consume(dsn, "t", "other")) == 10
    # --reset moves an existing group back
    assert len(consume(dsn, "t", "g", "--reset", "--from", "earliest")) == 10


def test_consume_from_latest(dsn: str) -> None:
    ok(dsn, "topics", "create", "t", "-p", "2")
    ok(dsn, "produce", "t", stdin="old1\nold2\nold3\n")
    assert consume(dsn, "t", "fresh", "--from", "latest") == []
    cmd = [sys.executable, "-m", "pgstreams.cli", "consume", "t", "--group", "live", "--from", "latest",
           "--follow", "--max", "2", "--dsn", dsn]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        with pgstreams.connect(dsn) as client:
            deadline = time.monotonic() + 60
            while True:  # wait until the follower has placed its checkpoints at the end
                try:
                    if len(client.describe_group("live", "t")) == 2:
                        break
                except pgstreams.GroupNotFound:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
                time.sleep(0.05)
            client.publish("t", "new1", key="k")
            client.publish("t", "new2", key="k")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["new1", "new2"]


def test_consume_from_time(dsn: str) -> None:
    ok(dsn, "topics", "create", "t", "-p", "3")
    ok(dsn, "produce", "t", stdin="before1\nbefore2\n")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    boundary = row[0]
    ok(dsn, "produce", "t", stdin="after1\nafter2\nafter3\n")
    utc = boundary.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    got = consume(dsn, "t", "g1", "--from", utc)
    assert sorted(e["value"] for e in got) == ["after1", "after2", "after3"]
    # the same instant written with another offset means the same thing
    shifted = boundary.astimezone(timezone(timedelta(hours=-5, minutes=-30))).isoformat()
    got = consume(dsn, "t", "g2", "--from", shifted)
    assert sorted(e["value"] for e in got) == ["after1", "after2", "after3"]
    assert len(consume(dsn, "t", "g3", "--from", "2000-01-01T00:00:00+00:00")) == 5


def test_groups_describe_lag_goes_to_zero(dsn: str) -> None:
    ok(dsn, "topics", "create", "t", "-p", "3")
    ok(dsn, "produce", "t", "-k", "=", stdin="".join(f"k{i}=v{i}\n" for i in range(12)))
    assert len(consume(dsn, "t", "g", "--max", "5")) == 5
    status = group_json(dsn, "g")
    assert [s["partition"] for s in status] == [0, 1, 2]
    assert sum(s["lag"] for s in status) == 7
    listed = json.loads(ok(dsn, "groups", "list", "--json"))
    assert listed == [{"group": "g", "topics": ["t"], "lag": 7}]
    table = ok(dsn, "groups", "describe", "g")
    assert "checkpoint" in table and "lag" in table and "total lag: 7" in table
    # a consumer's group: no member holds a partition (the words of pgstreams.GROUP_STATES, PARTITION_STATES)
    assert "state on t: Empty" in table and "unassigned" in table and "unowned" not in table
    assert "g" in ok(dsn, "groups", "list")
    assert len(consume(dsn, "t", "g")) == 7
    status = group_json(dsn, "g")
    assert all(s["lag"] == 0 and s["checkpoint"] == s["head"] for s in status)
    assert "total lag: 0" in ok(dsn, "groups", "describe", "g", "--topic", "t")


def test_produce_bad_line_publishes_nothing_of_its_batch(dsn: str) -> None:
    ok(dsn, "topics", "create", "t")
    msg = fails(dsn, 2, "produce", "t", "--json", "--batch-size", "2", stdin="1\n2\n3\n{bad\n5\n")
    assert "line 4" in msg and "invalid JSON" in msg and "lines 3 to 4 not published" in msg
    assert sorted(e["value"] for e in consume(dsn, "t", "g")) == [1, 2]
    msg = fails(dsn, 2, "produce", "t", "--key-separator", ",", stdin="a,1\nno separator\n")
    assert "line 2" in msg and "nothing published" in msg
    msg = fails(dsn, 2, "produce", "t", "--json", stdin="NaN\n")
    assert "line 1" in msg
    assert consume(dsn, "t", "g") == []


def test_consume_stops_quietly_when_stdout_closes(dsn: str) -> None:
    ok(dsn, "topics", "create", "t")
    ok(dsn, "produce", "t", "-q", stdin="".join(f"{'x' * 200}{i}\n" for i in range(3000)))
    cmd = [sys.executable, "-m", "pgstreams.cli", "consume", "t", "--group", "g", "--batch-size", "100",
           "--dsn", dsn]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["position"] == 1
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
    assert 0 < sum(s["lag"] for s in group_json(dsn, "g")) < 3000


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("topics", "create", "bad name"),
    ("topics", "create", "x" * 250),
    ("topics", "create", "t", "--partitions", "0"),
    ("topics", "create", "t", "--partitions", "100000"),
    ("topics", "create", "t", "--partitions", "abc"),
    ("topics", "describe", "a/b"),
    ("topics", "list", "--schema", "1bad"),
    ("topics", "list", "--dsn", "not a dsn"),
    ("topics", "list", "--no-such-option"),
    ("topics", "nosuch"),
    ("consume", "t"),
    ("consume", "t", "--group", "bad group"),
    ("consume", "t", "--group", "g", "--from", "2024-01-01T00:00:00"),
    ("consume", "t", "--group", "g", "--from", "2024-01-01"),
    ("consume", "t", "--group", "g", "--from", "yesterday"),
    ("consume", "t", "--group", "g", "--max", "0"),
    ("consume", "t", "--group", "g", "--partition", "9"),
    ("produce", "t", "--key-separator", ""),
    ("produce", "t", "--header", "novalue"),
    ("produce", "t", "--partition", "5"),
    ("produce", "t", "--batch-size", "0"),
    ("groups", "describe", "bad group"),
    ("topics", "list", "--pooler", "bogus"),
    ("produce", "t", "--pooler", "statement"),
    ("consume", "t", "--group", "g", "--pooler", "transaction", "--listen-dsn", "bogus=1"),
])
def test_usage_errors_exit_2(dsn: str, args: tuple[str, ...]) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", partitions=2)
    fails(None if "--dsn" in args else dsn, 2, *args, stdin="")


@pytest.mark.parametrize("args, message", [
    (("topics", "describe", "missing"), "error: topic 'missing' does not exist"),
    (("topics", "delete", "missing"), "error: topic 'missing' does not exist"),
    (("produce", "missing"), "error: topic 'missing' does not exist"),
    (("consume", "missing", "--group", "g"), "error: topic 'missing' does not exist"),
    (("groups", "describe", "nobody"), "error: group 'nobody' has no checkpoints"),
    (("topics", "create", "t", "-p", "3"), "error: topic 't' exists with 2 partitions, not 3"),
])
def test_other_errors_exit_1(dsn: str, args: tuple[str, ...], message: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", partitions=2)
    assert fails(dsn, 1, *args, stdin="x\n") == message


def test_the_pooler_option_names_its_modes(dsn: str) -> None:
    """``--pooler`` takes session or transaction; any other value is a usage error naming the option and
    the modes, before anything is connected; ``--pooler transaction`` works."""
    message = fails(dsn, 2, "topics", "list", "--pooler", "bogus")
    assert message == ("error: --pooler must be one of 'session' or 'transaction' (the pooling mode of a "
                       "connection pooler in front of PostgreSQL), got 'bogus'")
    ok(dsn, "topics", "create", "pooled", "--pooler", "transaction")
    assert "pooled" in ok(dsn, "topics", "list", "--pooler", "transaction")


def test_cannot_connect_exits_1() -> None:
    for args in (("topics", "list"), ("migrate", "--status")):
        msg = fails("postgresql://postgres@127.0.0.1:1/nothing?connect_timeout=5", 1, *args)
        assert "cannot connect" in msg


# -- quickstart --------------------------------------------------------------------------------------
def test_quickstart_runs_twice_and_cleans_up(dsn: str) -> None:
    for _ in range(2):
        out = ok(dsn, "quickstart")
        assert "billing" in out and "analytics" in out and "Deleted topic" in out
    with pgstreams.connect(dsn) as client:
        assert client.list_topics() == []
    out = ok(dsn, "quickstart", "--keep")
    with pgstreams.connect(dsn) as client:
        (topic,) = client.list_topics()
        assert topic.name in out and topic.partitions == 3
        for group in ("billing", "analytics"):
            status = client.describe_group(group, topic.name)
            assert sum(s.lag for s in status) == 0 and len(status) == 3
