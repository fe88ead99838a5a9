"""``pgstreams server status|start|stop`` and the embedded server's life: a command stopped with SIGTERM
releases it, and a user killed without exiting is forgotten, through real subprocesses, each test with a
``PGSTREAMS_HOME`` (and so an embedded server) of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from _core_helpers import wait_until
from _system import free_port

CLI = [sys.executable, "-m", "pgstreams.cli"]


@pytest.fixture
def home_env() -> Iterator[dict[str, str]]:
    """The environment of commands with a ``PGSTREAMS_HOME`` of their own and no DSN (outside pytest's
    temporary tree: as root, the embedded server runs as another user, who must traverse its parents).
    The server is stopped at the end, whatever the test left."""
    root = Path(tempfile.mkdtemp(prefix="pgstreams-home-"))
    root.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PGSTREAMS_DSN", "PGSTREAMS_TEST_DSN")}
    env["PGSTREAMS_HOME"] = str(root / "home")
    yield env
    subprocess.run([*CLI, "server", "stop"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=180)


def status(env: dict[str, str]) -> dict[str, Any]:
    p = run(env, "server", "status", "--json")
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout))


def test_server_start_keeps_it_running_status_shows_its_dsn_and_stop_stops_it(
        home_env: dict[str, str]) -> None:
    before = status(home_env)
    assert before["running"] is False and before["dsn"] is None and before["users"] == []
    assert not Path(before["pgdata"]).exists()  # status starts nothing, creates nothing

    started = run(home_env, "server", "start")
    assert started.returncode == 0, started.stderr
    assert "state: running" in started.stdout and "dsn: postgresql://" in started.stdout
    now = status(home_env)  # the start command has exited: the server runs on, used by no process
    assert now["running"] is True and now["users"] == [] and now["pgdata"] == before["pgdata"]
    with psycopg.connect(now["dsn"], connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    text = run(home_env, "server", "status")
    assert f"dsn: {now['dsn']}" in text.stdout and "kept running by `pgstreams server start`" in text.stdout

    stopped = run(home_env, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped the embedded server" in stopped.stdout
    assert status(home_env)["running"] is False
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(now["dsn"], connect_timeout=5).close()
    again = run(home_env, "server", "stop")
    assert again.returncode == 0 and "is not running" in again.stdout


def test_a_console_stopped_with_sigterm_releases_the_embedded_server(home_env: dict[str, str]) -> None:
    """The console started the embedded server on demand (no DSN); SIGTERM ends it with exit code 143
    through its exit handlers, so the server, which nothing else uses, stops."""
    port = free_port()
    proc = subprocess.Popen([*CLI, "console", "--port", str(port)], env=home_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def serving() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:  # the socket listens before the client connects: ask for a page
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    return bool(page.status == 200)
            except OSError:
                return False

        wait_until(serving, 120, "the console serving its pages", every=0.2)
        running = status(home_env)
        assert running["running"] is True and running["users"] == [proc.pid]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert status(home_env)["running"] is False


def test_a_user_killed_without_exiting_is_forgotten_by_the_next_command(home_env: dict[str, str]) -> None:
    """A process that used the server is killed (SIGKILL: no exit handler runs, its pid stays listed);
    the next command that uses the server forgets it, and stops the server when it exits."""
    script = "import pgstreams, time\nc = pgstreams.connect()\nprint('up', flush=True)\ntime.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", script], env=home_env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        assert status(home_env)["users"] == [holder.pid]
        holder.kill()
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    assert status(home_env)["running"] is True  # nothing stopped it
    listed = run(home_env, "topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert status(home_env)["running"] is False


def test_a_worker_on_the_embedded_server_shows_its_start_up_lines_only_with_log_level_debug(
        home_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text("def handle(event):\n    pass\n")
    created = run(home_env, "topics", "create", "t")
    assert created.returncode == 0, created.stderr
    argv = [*CLI, "worker", "handlers:handle", "--topic", "t", "--group", "g"]
    for level, shown in (("info", False), ("debug", True)):
        proc = subprocess.Popen([*argv, "--log-level", level], env=home_env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines: list[str] = []
        assert proc.stderr is not None
        for line in proc.stderr:  # until the worker says it runs
            lines.append(line)
            if " INFO worker " in line and " started: g/t" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
        text = "".join(lines) + rest
        assert proc.returncode == 0, text
        assert ("pg_ctl" in text) is shown, text  # pgserver's lines (starting, stopping the server)
