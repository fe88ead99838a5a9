"""The embedded server: connect() with no DSN starts it under PGSTREAMS_HOME (with wal_level = logical);
its data persists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _core_helpers import wait_until

FIRST = textwrap.dedent("""
    import json, pgstreams
    with pgstreams.connect() as client:
        client.create_topic("persisted", 2)
        client.publish("persisted", {"n": 1}, key="a")
        client.publish("persisted", "two", key="b")
        c = client.consumer("persisted", "g")
        c.commit(c.poll(max_events=1, timeout=10))
        with client.connection() as conn:
            wal_level = conn.execute("SHOW wal_level").fetchone()[0]
        print(json.dumps({"dsn": client.dsn, "wal_level": wal_level}))
""")

SECOND = textwrap.dedent("""
    import json, pgstreams
    with pgstreams.connect() as client:
        topics = [t.name for t in client.list_topics()]
        c = client.consumer("persisted", "g")
        rest = c.poll(max_events=10, timeout=10)
        everything = client.consumer("persisted", "new").poll(max_events=10, timeout=10)
        print(json.dumps({"dsn": client.dsn, "topics": topics, "rest": len(rest),
                          "all": sorted(str(e.value) for e in everything)}))
""")


@pytest.fixture
def home() -> Iterator[Path]:
    """A PGSTREAMS_HOME outside pytest's temporary tree: as root, the embedded server runs as another
    user and needs to traverse its parents, and every pytest session on the machine resets the mode of
    pytest's own root to 0700 when it starts."""
    root = Path(tempfile.mkdtemp(prefix="pgstreams-home-"))
    yield root / "home"
    shutil.rmtree(root, ignore_errors=True)


def _run(script: str, home: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGSTREAMS_DSN", "PGSTREAMS_TEST_DSN")}
    env["PGSTREAMS_HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_embedded_server_starts_persists_and_is_reused(home: Path) -> None:
    first = _run(FIRST, home)
    pgdata = home / "pgdata"
    assert (pgdata / "PG_VERSION").exists(), "the data directory is not under PGSTREAMS_HOME"
    # the server stopped with the last process using it
    wait_until(lambda: not (pgdata / "postmaster.pid").exists(), 30, "the embedded server to stop")
    second = _run(SECOND, home)
    assert second["topics"] == ["persisted"]
    assert second["rest"] == 1  # the group's checkpoint survived the restart
    assert second["all"] == sorted(["{'n': 1}", "two"])
    assert isinstance(first["dsn"], str) and isinstance(second["dsn"], str)
    assert first["wal_level"] == "logical"  # change data capture works on the embedded server
    wait_until(lambda: not (pgdata / "postmaster.pid").exists(), 30, "the embedded server to stop")


QUIET = textwrap.dedent("""
    import json, os, psycopg
    from pgstreams.embedded import embedded_dsn
    before = dict(os.environ)
    dsn = embedded_dsn()
    with psycopg.connect(dsn) as conn:
        one = conn.execute("SELECT 1").fetchone()
    print(json.dumps({"one": one[0], "environ_unchanged": dict(os.environ) == before,
                      "xdg": os.environ.get("XDG_RUNTIME_DIR")}))
""")


@pytest.mark.slow
def test_embedded_server_starts_without_xdg_runtime_dir_quietly_and_leaves_the_environment(
        home: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PGSTREAMS_DSN", "PGSTREAMS_TEST_DSN", "XDG_RUNTIME_DIR", "PYTHONWARNINGS")}
    env["PGSTREAMS_HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no warning about the unset runtime directory, nor anything else
    assert json.loads(proc.stdout) == {"one": 1, "environ_unchanged": True, "xdg": None}
    wait_until(lambda: not (home / "pgdata" / "postmaster.pid").exists(), 30, "the embedded server to stop")
